/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_journal.c - the intent journal (lib/client/journal.c).  The journal is what keeps a
 * re-run command from becoming a second purchase, so the tests pin what it promises: a round
 * trip through the file, one fsync after each append (and the whole record on disk by then),
 * processes sharing one file, and every kind of damage - a last line cut short, a flipped byte,
 * a wrong length, an unknown record - reported with the file and line, never skipped.
 */
#include "client_internal.h"
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void path_in_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

static void spit(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");

    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_INT(fwrite(data, 1, len, f), len);
    fclose(f);
}

static int count_lines(const char *s)
{
    int n = 0;

    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void test_crc32(void)
{
    /* The CRC-32 check value of the catalogue of parametrised CRCs. */
    CHECK_INT(idem_client__crc32(0, "123456789", 9), 0xcbf43926u);
    CHECK_INT(idem_client__crc32(0, "", 0), 0);
    /* Incremental equals one-shot. */
    CHECK_INT(idem_client__crc32(idem_client__crc32(0, "1234", 4), "56789", 5), 0xcbf43926u);
}

static void test_round_trip(void)
{
    char path[300];
    struct idem_client_journal *j = NULL;
    const struct idem_client_intent *it = NULL;
    char *err = NULL, key1[IDEM_CLIENT_KEY_MAX + 1];
    /* Names may hold anything but NUL: spaces, '%', newlines, UTF-8. */
    const char *odd = "buy 2 tickets % for caf\xc3\xa9\nline two";

    path_in_dir(path, sizeof path, "round-trip");
    CHECK_INT(idem_client_journal_open(path, &j, &err), 0);
    CHECK(err == NULL);
    CHECK_INT(idem_client_journal_count(j), 0);
    CHECK_STR(idem_client_journal_path(j), path);

    CHECK_INT(idem_client_journal_lookup(j, "buy-1", &it), 0);
    CHECK(it == NULL);

    CHECK_INT(idem_client_journal_begin(j, "buy-1", NULL, &it), 0);
    CHECK(it != NULL && it->created == 1);
    CHECK_STR(it->name, "buy-1");
    CHECK_INT(strlen(it->key), IDEM_CLIENT_UUID_LEN);
    CHECK_INT(it->final_status, 0);
    snprintf(key1, sizeof key1, "%s", it->key);

    /* The same intent again: the same key, nothing written. */
    CHECK_INT(idem_client_journal_begin(j, "buy-1", NULL, &it), 0);
    CHECK(it != NULL && it->created == 0);
    CHECK_STR(it->key, key1);
    /* With its own key named: accepted; with another: refused. */
    CHECK_INT(idem_client_journal_begin(j, "buy-1", key1, &it), 0);
    CHECK_INT(idem_client_journal_begin(j, "buy-1", "other-key", &it), IDEM_CLIENT_EINTENT);
    CHECK(strstr(idem_client_journal_errmsg(j), key1) != NULL);

    /* A caller's key for a new intent; and a name that needs escaping. */
    CHECK_INT(idem_client_journal_begin(j, "refund-7", "my-key-7", &it), 0);
    CHECK(it->created == 1);
    CHECK_STR(it->key, "my-key-7");
    CHECK_INT(idem_client_journal_begin(j, odd, NULL, &it), 0);
    CHECK(it->created == 1);

    /* Bad arguments. */
    CHECK_INT(idem_client_journal_begin(j, "", NULL, &it), IDEM_CLIENT_EINVAL);
    CHECK_INT(idem_client_journal_begin(j, "x", "bad key", &it), IDEM_CLIENT_EKEY);
    CHECK_INT(idem_client_journal_finish(j, "unknown", 201), IDEM_CLIENT_EINVAL);
    CHECK_INT(idem_client_journal_finish(j, "buy-1", 42), IDEM_CLIENT_EINVAL);

    /* Final statuses: a non-2xx is replaced by the next final status; a 2xx stays. */
    CHECK_INT(idem_client_journal_finish(j, "buy-1", 401), 0);
    CHECK_INT(idem_client_journal_finish(j, "buy-1", 201), 0);
    CHECK_INT(idem_client_journal_finish(j, "buy-1", 422), 0);
    CHECK_INT(idem_client_journal_lookup(j, "buy-1", &it), 0);
    CHECK(it != NULL && it->final_status == 201);
    CHECK_INT(idem_client_journal_finish(j, "refund-7", 409), 0);
    idem_client_journal_close(j);
    j = NULL;

    /* Everything comes back from the file, in the order first journaled. */
    CHECK_INT(idem_client_journal_open(path, &j, &err), 0);
    CHECK_INT(idem_client_journal_count(j), 3);
    it = idem_client_journal_at(j, 0);
    CHECK(it != NULL);
    if (it) {
        CHECK_STR(it->name, "buy-1");
        CHECK_STR(it->key, key1);
        CHECK_INT(it->final_status, 201);
        CHECK(it->created_ms > 1700000000000LL);
    }
    it = idem_client_journal_at(j, 1);
    CHECK(it != NULL && strcmp(it->key, "my-key-7") == 0 && it->final_status == 409);
    it = idem_client_journal_at(j, 2);
    CHECK(it != NULL && strcmp(it->name, odd) == 0 && it->final_status == 0);
    CHECK(idem_client_journal_at(j, 3) == NULL);
    CHECK_INT(idem_client_journal_lookup(j, odd, &it), 0);
    CHECK(it != NULL);
    idem_client_journal_close(j);

    /* Each line is framed "crc len payload" and the name is escaped: no raw newline inside. */
    {
        char *data = slurp(path, NULL);
        CHECK(data != NULL);
        if (data) {
            /* K buy-1, K refund-7, K odd, S 401, S 201, S 409 (the 422 wrote nothing) */
            CHECK_INT(count_lines(data), 6);
            CHECK(strstr(data, "buy%202%20tickets%20%25%20for%20caf%C3%A9%0Aline%20two") != NULL);
        }
        free(data);
    }
    CHECK_INT(idem_client_journal_open("", &j, &err), IDEM_CLIENT_EINVAL);
    idem_client_free(err);
    err = NULL;
    idem_client_journal_close(NULL);
}

/* ---- fsync after each append ------------------------------------------------------------------
 */

static int fsyncs;
static int fsync_saw_whole_record;
static int fsync_should_fail;

/* Runs in place of fsync(): at that moment the whole record, newline included, is in the file. */
static int counting_fsync(int fd)
{
    struct stat st;
    char last = 0;

    fsyncs++;
    if (fstat(fd, &st) == 0 && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) == 1)
        fsync_saw_whole_record += last == '\n';
    if (fsync_should_fail) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

static void test_fsync_per_append(void)
{
    char path[300];
    struct idem_client_journal *j = NULL, *j2 = NULL;
    const struct idem_client_intent *it = NULL;
    char *err = NULL;

    path_in_dir(path, sizeof path, "fsync");
    CHECK_INT(idem_client_journal_open(path, &j, &err), 0);
    idem_client__journal_set_fsync(j, counting_fsync);

    CHECK_INT(idem_client_journal_begin(j, "a", NULL, &it), 0);
    CHECK_INT(fsyncs, 1);
    /* Durable when begin returns: another handle (another process) reads it at once. */
    CHECK_INT(idem_client_journal_open(path, &j2, &err), 0);
    CHECK_INT(idem_client_journal_count(j2), 1);
    idem_client_journal_close(j2);

    CHECK_INT(idem_client_journal_begin(j, "b", NULL, &it), 0);
    CHECK_INT(fsyncs, 2);
    CHECK_INT(idem_client_journal_begin(j, "a", NULL, &it), 0); /* known: no append */
    CHECK_INT(fsyncs, 2);
    CHECK_INT(idem_client_journal_finish(j, "a", 201), 0);
    CHECK_INT(fsyncs, 3);
    CHECK_INT(idem_client_journal_finish(j, "a", 201), 0); /* unchanged: no append */
    CHECK_INT(fsyncs, 3);
    CHECK_INT(fsync_saw_whole_record, 3);

    /* A failed fsync is an error, not a silent success. */
    fsync_should_fail = 1;
    CHECK_INT(idem_client_journal_begin(j, "c", NULL, &it), IDEM_CLIENT_EJOURNAL);
    CHECK(strstr(idem_client_journal_errmsg(j), "fsync") != NULL);
    CHECK(strstr(idem_client_journal_errmsg(j), path) != NULL);
    fsync_should_fail = 0;
    idem_client__journal_set_fsync(j, NULL);
    idem_client_journal_close(j);
}

/* Two handles on one file, as two processes: the second sees the first's key, never its own. */
static void test_shared_file(void)
{
    char path[300], key[IDEM_CLIENT_KEY_MAX + 1];
    struct idem_client_journal *a = NULL, *b = NULL;
    const struct idem_client_intent *it = NULL;

    path_in_dir(path, sizeof path, "shared");
    CHECK_INT(idem_client_journal_open(path, &a, NULL), 0);
    CHECK_INT(idem_client_journal_open(path, &b, NULL), 0);
    CHECK_INT(idem_client_journal_begin(a, "pay-9", NULL, &it), 0);
    snprintf(key, sizeof key, "%s", it->key);
    CHECK_INT(idem_client_journal_begin(b, "pay-9", NULL, &it), 0);
    CHECK(it->created == 0);
    CHECK_STR(it->key, key);
    CHECK_INT(idem_client_journal_finish(b, "pay-9", 201), 0);
    CHECK_INT(idem_client_journal_lookup(a, "pay-9", &it), 0);
    CHECK(it != NULL && it->final_status == 201);
    idem_client_journal_close(a);
    idem_client_journal_close(b);
}

/* ---- scale and compaction ------------------------------------------------
 */

/* 20,000 fsyncs would make the test about the disk, not the journal. */
static int no_fsync(int fd)
{
    (void)fd;
    return 0;
}

/* 20,000 intents: every one found again, by this handle and by one that reads them appended. */
static void test_many_intents(void)
{
    char path[300], name[64], keys[3][IDEM_CLIENT_KEY_MAX + 1];
    struct idem_client_journal *a = NULL, *b = NULL;
    const struct idem_client_intent *it = NULL;
    int missing = 0;

    path_in_dir(path, sizeof path, "many");
    CHECK_INT(idem_client_journal_open(path, &a, NULL), 0);
    CHECK_INT(idem_client_journal_open(path, &b, NULL), 0);
    idem_client__journal_set_fsync(a, no_fsync);
    for (int i = 0; i < 20000; i++) {
        snprintf(name, sizeof name, "intent-%d", i);
        if (idem_client_journal_begin(a, name, NULL, &it) != 0 || !it || !it->created)
            missing++;
        if (i < 3 && it)
            snprintf(keys[i], sizeof keys[i], "%s", it->key);
    }
    CHECK_INT(missing, 0);
    CHECK_INT(idem_client_journal_count(a), 20000);
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "intent-%d", i);
        CHECK_INT(idem_client_journal_lookup(b, name, &it), 0);
        CHECK(it != NULL && strcmp(it->key, keys[i]) == 0);
    }
    CHECK_INT(idem_client_journal_lookup(b, "intent-19999", &it), 0);
    CHECK(it != NULL);
    CHECK_INT(idem_client_journal_lookup(b, "intent-20000", &it), 0);
    CHECK(it == NULL);
    CHECK_INT(idem_client_journal_count(b), 20000);
    idem_client_journal_close(a);
    idem_client_journal_close(b);
}

/* One journal line as client.h documents it, with a timestamp of the test's choosing. */
static void put_line(FILE *f, char type, long long ms, const char *name, const char *last)
{
    char payload[512];
    int n = snprintf(payload, sizeof payload, "%c %lld %s %s", type, ms, name, last);
    fprintf(f, "%08x %d %s\n", (unsigned)idem_client__crc32(0, payload, (size_t)n), n, payload);
}

static void test_compact(void)
{
    char path[300], key_open[IDEM_CLIENT_KEY_MAX + 1];
    struct idem_client_journal *a = NULL, *b = NULL;
    const struct idem_client_intent *it = NULL;
    size_t dropped = 9, kept = 9, before = 0, after = 0;
    long long old = (long long)clock_wall_ms() - 30LL * 24 * 3600 * 1000;
    char *text;
    FILE *f;

    /* Old and finished (dropped), old and unfinished (kept: a retry may come), recent (kept). */
    path_in_dir(path, sizeof path, "compact");
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    put_line(f, 'K', old, "old-done", "11111111-1111-4111-8111-111111111111");
    put_line(f, 'S', old, "old-done", "201");
    put_line(f, 'K', old, "old-open", "22222222-2222-4222-8222-222222222222");
    fclose(f);
    CHECK_INT(idem_client_journal_open(path, &a, NULL), 0);
    CHECK_INT(idem_client_journal_open(path, &b, NULL), 0);
    CHECK_INT(idem_client_journal_begin(a, "new-done", NULL, &it), 0);
    CHECK_INT(idem_client_journal_finish(a, "new-done", 200), 0);
    CHECK_INT(idem_client_journal_lookup(a, "old-open", &it), 0);
    CHECK(it != NULL);
    snprintf(key_open, sizeof key_open, "%s", it ? it->key : "");
    free(slurp(path, &before));

    CHECK_INT(idem_client_journal_compact(a, 7LL * 24 * 3600 * 1000, &dropped, &kept), 0);
    CHECK_INT(dropped, 1);
    CHECK_INT(kept, 2);
    text = slurp(path, &after);
    CHECK(text != NULL && after < before && count_lines(text) == 3);
    CHECK(text != NULL && strstr(text, "old-done") == NULL);
    free(text);
    CHECK_INT(idem_client_journal_lookup(a, "old-done", &it), 0);
    CHECK(it == NULL);

    /* The other handle follows the new file: same keys, the dropped intent gone, and appends. */
    CHECK_INT(idem_client_journal_lookup(b, "old-open", &it), 0);
    CHECK(it != NULL && strcmp(it->key, key_open) == 0);
    CHECK_INT(idem_client_journal_lookup(b, "old-done", &it), 0);
    CHECK(it == NULL);
    CHECK_INT(idem_client_journal_lookup(b, "new-done", &it), 0);
    CHECK(it != NULL && it->final_status == 200);
    CHECK_INT(idem_client_journal_begin(b, "after", NULL, &it), 0);
    CHECK_INT(idem_client_journal_lookup(a, "after", &it), 0);
    CHECK(it != NULL);
    idem_client_journal_close(a);
    idem_client_journal_close(b);

    /* A journal past its size limit compacts itself on the next append. */
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    for (int i = 0; i < 200; i++) {
        char name[32], key[40];
        snprintf(name, sizeof name, "stale-%d", i);
        snprintf(key, sizeof key, "33333333-3333-4333-8333-%012d", i);
        put_line(f, 'K', old, name, key);
        put_line(f, 'S', old, name, "201");
    }
    fclose(f);
    CHECK_INT(idem_client_journal_open(path, &a, NULL), 0);
    idem_client__journal_set_compact_bytes(a, 4096);
    CHECK_INT(idem_client_journal_count(a), 200);
    CHECK_INT(idem_client_journal_begin(a, "fresh", NULL, &it), 0);
    CHECK_INT(idem_client_journal_count(a), 1);
    text = slurp(path, &after);
    CHECK(text != NULL && count_lines(text) == 1 && strstr(text, "fresh") != NULL);
    free(text);
    idem_client_journal_close(a);
}

/* ---- damage -----------------------------------------------------------------------------------
 */

/* Writes a journal of three intents and returns its text (new). */
static char *three_intents(const char *path, size_t *len)
{
    struct idem_client_journal *j = NULL;
    const struct idem_client_intent *it = NULL;

    unlink(path);
    CHECK_INT(idem_client_journal_open(path, &j, NULL), 0);
    CHECK_INT(idem_client_journal_begin(j, "one", NULL, &it), 0);
    CHECK_INT(idem_client_journal_begin(j, "two", NULL, &it), 0);
    CHECK_INT(idem_client_journal_begin(j, "three", NULL, &it), 0);
    idem_client_journal_close(j);
    return slurp(path, len);
}

/* Opening `path` fails with `code`, and the message names the file, `line` and `words`. */
static void expect_damage(const char *path, int code, int line, const char *words)
{
    struct idem_client_journal *j = NULL;
    char *err = NULL, where[400];
    int rc;

    rc = idem_client_journal_open(path, &j, &err);
    CHECK_INT(rc, code);
    CHECK(j == NULL);
    CHECK(err != NULL);
    snprintf(where, sizeof where, "%s:%d: ", path, line);
    if (err && (!strstr(err, where) || !strstr(err, words)))
        fprintf(stderr, "message \"%s\" lacks \"%s\" or \"%s\"\n", err, where, words);
    CHECK(err && strstr(err, where) != NULL);
    CHECK(err && strstr(err, words) != NULL);
    idem_client_free(err);
    idem_client_journal_close(j);
}

static char *nth_line(char *s, int n)
{
    while (--n > 0 && s) {
        s = strchr(s, '\n');
        if (s)
            s++;
    }
    return s;
}

static void test_truncated_last_line(void)
{
    char path[300];
    size_t len;
    char *data;
    struct idem_client_journal *j = NULL;
    const struct idem_client_intent *it = NULL;

    path_in_dir(path, sizeof path, "truncated");
    data = three_intents(path, &len);
    CHECK(data != NULL);
    if (!data)
        return;
    /* The last append was cut short: half of line 3, no newline. */
    spit(path, data, len - 20);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 3, "truncated");
    /* Only the newline missing: still not trusted. */
    spit(path, data, len - 1);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 3, "truncated");

    /* A handle already open notices on its next call, and does not append after the damage. */
    spit(path, data, len);
    CHECK_INT(idem_client_journal_open(path, &j, NULL), 0);
    spit(path, data, len - 20);
    CHECK_INT(idem_client_journal_begin(j, "four", NULL, &it), IDEM_CLIENT_ECORRUPT);
    CHECK(strstr(idem_client_journal_errmsg(j), ":3: ") != NULL);
    CHECK_INT(idem_client_journal_lookup(j, "one", &it), IDEM_CLIENT_ECORRUPT);
    idem_client_journal_close(j);
    {
        size_t now = 0;
        char *after = slurp(path, &now);
        CHECK_INT(now, len - 20);
        free(after);
    }
    free(data);
}

static void test_corrupted_line(void)
{
    char path[300], *data, *line;
    size_t len;

    path_in_dir(path, sizeof path, "corrupt");

    /* A byte of line 2's payload flipped: the checksum catches it. */
    data = three_intents(path, &len);
    line = nth_line(data, 2);
    line[strlen("xxxxxxxx 57 K 1")] ^= 0x01;
    spit(path, data, len);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 2, "checksum mismatch");
    free(data);

    /* A byte of line 1's checksum changed. */
    data = three_intents(path, &len);
    data[0] = data[0] == 'f' ? '0' : 'f';
    spit(path, data, len);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 1, "checksum mismatch");
    free(data);

    /* Line 2 lost bytes in the middle (its newline survived). */
    data = three_intents(path, &len);
    line = nth_line(data, 2);
    memmove(line + 20, line + 25, len - (size_t)(line + 25 - data));
    spit(path, data, len - 5);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 2, "shorter than its length");
    free(data);

    /* Garbage, and an empty line. */
    data = three_intents(path, &len);
    {
        char *buf = malloc(len + 32);
        char *l3 = nth_line(data, 3);
        size_t head = (size_t)(l3 - data);
        memcpy(buf, data, head);
        memcpy(buf + head, "hello world\n", 12);
        memcpy(buf + head + 12, l3, len - head);
        spit(path, buf, len + 12);
        expect_damage(path, IDEM_CLIENT_ECORRUPT, 3, "malformed record");
        memcpy(buf + head, "\n", 1);
        memcpy(buf + head + 1, l3, len - head);
        spit(path, buf, len + 1);
        expect_damage(path, IDEM_CLIENT_ECORRUPT, 3, "malformed record");
        free(buf);
    }
    free(data);
}

/* Records with a valid frame whose content is wrong are refused too. */
static void write_record(FILE *f, const char *payload)
{
    fprintf(f, "%08x %zu %s\n", (unsigned)idem_client__crc32(0, payload, strlen(payload)),
            strlen(payload), payload);
}

static void test_bad_content(void)
{
    char path[300];
    FILE *f;
    struct idem_client_journal *j = NULL;

    path_in_dir(path, sizeof path, "content");
    f = fopen(path, "wb");
    write_record(f, "K 1 ok good-key");
    write_record(f, "X 1 ok good-key");
    fclose(f);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 2, "unknown record type");

    f = fopen(path, "wb");
    write_record(f, "K 1 ok good-key");
    write_record(f, "S 1 nobody 201");
    fclose(f);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 2, "without a key");

    f = fopen(path, "wb");
    write_record(f, "K 1 ok good-key");
    write_record(f, "K 2 ok another-key");
    fclose(f);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 2, "another key");

    f = fopen(path, "wb");
    write_record(f, "K 1 ok bad%20key");
    fclose(f);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 1, "malformed key");

    f = fopen(path, "wb");
    write_record(f, "K 1 bad%2 key");
    fclose(f);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 1, "malformed intent name");

    f = fopen(path, "wb");
    write_record(f, "K 1 ok good-key");
    write_record(f, "S 1 ok 2x1");
    fclose(f);
    expect_damage(path, IDEM_CLIENT_ECORRUPT, 2, "malformed status");

    /* The same K record twice is harmless (and a valid file opens). */
    f = fopen(path, "wb");
    write_record(f, "K 1 ok good-key");
    write_record(f, "K 1 ok good-key");
    write_record(f, "S 2 ok 201");
    fclose(f);
    CHECK_INT(idem_client_journal_open(path, &j, NULL), 0);
    CHECK_INT(idem_client_journal_count(j), 1);
    idem_client_journal_close(j);
}

static void test_unopenable(void)
{
    struct idem_client_journal *j = NULL;
    char *err = NULL, path[300];

    path_in_dir(path, sizeof path, "no/such/dir/journal");
    CHECK_INT(idem_client_journal_open(path, &j, &err), IDEM_CLIENT_EJOURNAL);
    CHECK(j == NULL);
    CHECK(err && strstr(err, path) && strstr(err, "cannot open"));
    idem_client_free(err);
}

int main(void)
{
    char cmd[400];
    const char *tmp = getenv("TMPDIR");
    int rc;

    snprintf(dir, sizeof dir, "%s/idem-journal-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_crc32();
    test_round_trip();
    test_fsync_per_append();
    test_shared_file();
    test_many_intents();
    test_compact();
    test_truncated_last_line();
    test_corrupted_line();
    test_bad_content();
    test_unopenable();
    rc = t_done();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}
