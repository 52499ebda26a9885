/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_journal.c - libFuzzer harness for the client journal reader (lib/client/journal.c): a
 * journal is a file any process of the user may have written, damaged by a crash or a full disk.
 * The input is the file.  It is opened, an intent is looked up and journaled, and the table is
 * read back; then the journal is compacted and read again.
 *
 * Besides memory errors and leaks it checks: a journal either opens or says why (a message, a
 * known error code); every intent it lists has a name and a valid key; an intent journaled into
 * it is found again, with the same key, after a compaction too.
 */
#include "idem/client.h"
#include "fuzz.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

static void remove_scratch(void)
{
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct idem_client_journal *j = NULL;
    const struct idem_client_intent *it = NULL;
    char *err = NULL, key[IDEM_CLIENT_KEY_MAX + 1];
    size_t n, dropped, kept;
    int fd, rc;

    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/fuzz-journal-%ld", (long)getpid());
        atexit(remove_scratch);
    }
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0, "the scratch file");
    CHECK(write(fd, data, size) == (ssize_t)size, "writing the scratch file");
    close(fd);

    rc = idem_client_journal_open(path, &j, &err);
    if (rc != 0) {
        CHECK(j == NULL && err != NULL && err[0] != '\0', "a refusal says why");
        CHECK(rc == IDEM_CLIENT_ECORRUPT || rc == IDEM_CLIENT_ETOOBIG || rc == IDEM_CLIENT_ENOMEM ||
                  rc == IDEM_CLIENT_EJOURNAL,
              "a known error");
        idem_client_free(err);
        return 0;
    }
    n = idem_client_journal_count(j);
    for (size_t i = 0; i < n; i++) {
        it = idem_client_journal_at(j, i);
        CHECK(it && it->name && it->name[0] && it->key && idem_client_key_check(it->key, NULL) == 0,
              "every intent has a name and a valid key");
    }
    CHECK(idem_client_journal_begin(j, "fuzz-intent", NULL, &it) == 0 && it, "journaling works");
    snprintf(key, sizeof key, "%s", it->key);
    CHECK(idem_client_journal_finish(j, "fuzz-intent", 201) == 0, "finishing works");
    CHECK(idem_client_journal_compact(j, 3600 * 1000, &dropped, &kept) == 0, "compaction works");
    CHECK(idem_client_journal_lookup(j, "fuzz-intent", &it) == 0 && it && strcmp(it->key, key) == 0,
          "a fresh intent survives its compaction, key and all");
    idem_client_journal_close(j);
    return 0;
}
