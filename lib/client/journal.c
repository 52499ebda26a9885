/* SPDX-License-Identifier: Apache-2.0 */
/*
 * journal.c - the intent journal: the client's memory of which key belongs to which business
 * intent, kept on disk before the first byte goes out.  If the process is killed mid-request and
 * the command runs again, the same intent finds the same key, and the server answers with the
 * stored result instead of executing a second time.
 *
 * It is an append-only text file, one record per line, each line carrying a CRC-32 and the
 * length of its payload (client.h shows the format).  Appends are a single write() followed by
 * fsync(), under an exclusive flock so that processes sharing the file cannot interleave.  A
 * line that fails its checksum or length, or a last line cut short, is reported with the file
 * and line number and stops every call: a journal that silently dropped a record could hand out
 * a fresh key for an intent that already ran, which is the one thing it exists to prevent.
 */
#include "client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ascii.h"
#include "banned.h"

/* The largest journal read whole (at open, or after another process compacted it). */
#define JOURNAL_MAX_BYTES (64u << 20)
/* Past this size the journal compacts itself (idem_client_journal_compact) after an append. */
#define JOURNAL_COMPACT_BYTES (16u << 20)
/* What an automatic compaction drops: finished intents older than this. */
#define JOURNAL_COMPACT_AGE_MS ((int64_t)7 * 24 * 3600 * 1000)
/* The longest line: both fields fully percent-encoded, plus the record's framing. */
#define LINE_MAX_BYTES (3 * (IDEM_CLIENT_INTENT_MAX + IDEM_CLIENT_KEY_MAX) + 64)

/*
 * The intents in journal order, with a hash index by name (open addressing; a slot holds an
 * item's index + 1, 0 when empty), so a lookup costs the same with one intent or a million.
 */
struct table {
    struct idem_client_intent *items; /* name and key are owned (malloc'd) */
    size_t n, cap;
    size_t *slots;
    size_t nslots; /* a power of two, at least twice n */
};

struct idem_client_journal {
    char *path;
    int fd;
    struct table t;
    /*
     * What of the file is in `t`: its first `loaded` bytes, of the file (dev, ino).  A call reads
     * only what other processes appended since; a file replaced by a compaction is read whole.
     */
    off_t loaded;
    dev_t dev;
    ino_t ino;
    size_t compact_bytes; /* automatic compaction past this size (0: never) */
    off_t compacted_size; /* the size the last compaction left, to not redo it for nothing */
    struct idem_client_intent view; /* what begin/lookup hand out: borrowed */
    int (*fsync_fn)(int fd);
    char errmsg[IDEM_CLIENT_ERRMSG_MAX];
};

/* ---- CRC-32 ---------------------------------------------------------------------------------- */

uint32_t idem_client__crc32(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    size_t i;
    int k;

    /* Bitwise, no table: journal lines are short, and there is no table to get wrong. */
    crc = ~crc;
    for (i = 0; i < len; i++) {
        crc ^= p[i];
        for (k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (UINT32_C(0xedb88320) & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* ---- field encoding ---------------------------------------------------------------------------
 */

static int must_escape(unsigned char c)
{
    return c < 0x21 || c > 0x7e || c == '%';
}

/* Appends the percent-encoded `s` to out[*o] (the caller sized `out` for the worst case). */
static void encode(char *out, size_t *o, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *p = (const unsigned char *)s;

    for (; *p; p++) {
        if (must_escape(*p)) {
            out[(*o)++] = '%';
            out[(*o)++] = hex[*p >> 4];
            out[(*o)++] = hex[*p & 0x0f];
        } else {
            out[(*o)++] = (char)*p;
        }
    }
}

/* Decodes `len` bytes into a new string; NULL for a bad escape, a NUL, or no memory. */
static char *decode(const char *s, size_t len, int *nomem)
{
    char *out = malloc(len + 1);
    size_t i, o = 0;
    int hi, lo;

    if (!out) {
        *nomem = 1;
        return NULL;
    }
    for (i = 0; i < len; i++) {
        if (s[i] != '%') {
            out[o++] = s[i];
            continue;
        }
        if (i + 2 >= len) {
            free(out);
            return NULL;
        }
        hi = hex_value(s[i + 1]);
        lo = hex_value(s[i + 2]);
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            free(out);
            return NULL;
        }
        out[o++] = (char)(hi * 16 + lo);
        i += 2;
    }
    out[o] = '\0';
    return out;
}

/* ---- the in-memory table ----------------------------------------------------------------------
 */

static void table_clear(struct table *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free((void *)t->items[i].name);
        free((void *)t->items[i].key);
    }
    free(t->items);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

/* FNV-1a: the names are the caller's own, so no adversary picks collisions. */
static size_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return (size_t)h;
}

static struct idem_client_intent *find(const struct table *t, const char *name)
{
    if (t->nslots == 0)
        return NULL;
    for (size_t i = name_hash(name) & (t->nslots - 1);; i = (i + 1) & (t->nslots - 1)) {
        size_t s = t->slots[i];
        if (s == 0)
            return NULL;
        if (strcmp(t->items[s - 1].name, name) == 0)
            return &t->items[s - 1];
    }
}

/* Indexes items[k] (its name is not in the table yet). */
static void slot_index(struct table *t, size_t k)
{
    size_t i = name_hash(t->items[k].name) & (t->nslots - 1);
    while (t->slots[i] != 0)
        i = (i + 1) & (t->nslots - 1);
    t->slots[i] = k + 1;
}

/*
 * Appends an intent that owns `name` and `key` (on success; on failure the caller still does).
 * Returns it, or NULL when memory runs out.
 */
static struct idem_client_intent *table_add(struct table *t, char *name, char *key,
                                            int64_t created_ms)
{
    struct idem_client_intent *it;

    if (t->n == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        struct idem_client_intent *p = realloc(t->items, ncap * sizeof *p);
        if (!p)
            return NULL;
        t->items = p;
        t->cap = ncap;
    }
    if ((t->n + 1) * 2 > t->nslots) {
        size_t nslots = t->nslots ? t->nslots * 2 : 32;
        size_t *slots = calloc(nslots, sizeof *slots);
        if (!slots)
            return NULL;
        free(t->slots);
        t->slots = slots;
        t->nslots = nslots;
        for (size_t k = 0; k < t->n; k++)
            slot_index(t, k);
    }
    it = &t->items[t->n];
    memset(it, 0, sizeof *it);
    it->name = name;
    it->key = key;
    it->created_ms = created_ms;
    slot_index(t, t->n);
    t->n++;
    return it;
}

/*
 * An intent that once got a 2xx succeeded, whatever a later run with an edited body (422) says;
 * any other final status is replaced by the next one (a 401 fixed with the right token).
 */
static int is_2xx(int status)
{
    return status >= 200 && status <= 299;
}

/* ---- reading ----------------------------------------------------------------------------------
 */

/* Splits off the next space-separated field of payload[*i, len). */
static int next_field(const char *p, size_t len, size_t *i, const char **f, size_t *flen)
{
    size_t b = *i;

    while (*i < len && p[*i] != ' ')
        (*i)++;
    if (*i == b)
        return -1;
    *f = p + b;
    *flen = *i - b;
    if (*i < len)
        (*i)++; /* the separating space */
    return 0;
}

static int parse_decimal(const char *f, size_t flen, int64_t max, int64_t *out)
{
    int64_t v = 0;
    size_t i;

    if (flen == 0 || flen > 19)
        return -1;
    for (i = 0; i < flen; i++) {
        if (f[i] < '0' || f[i] > '9')
            return -1;
        v = v * 10 + (f[i] - '0');
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

/*
 * Applies one payload to the table.  Returns 0, IDEM_CLIENT_ECORRUPT with *why set, or
 * IDEM_CLIENT_ENOMEM.
 */
static int apply(struct table *t, const char *p, size_t len, const char **why)
{
    int rc = IDEM_CLIENT_ECORRUPT;
    const char *type, *ms, *name_f, *last;
    size_t type_len, ms_len, name_len, last_len, i = 0;
    char *name = NULL, *key = NULL;
    int64_t when, status;
    struct idem_client_intent *it;
    int nomem = 0;

    if (next_field(p, len, &i, &type, &type_len) < 0 || next_field(p, len, &i, &ms, &ms_len) < 0 ||
        next_field(p, len, &i, &name_f, &name_len) < 0 ||
        next_field(p, len, &i, &last, &last_len) < 0 || i != len) {
        *why = "malformed record (expected 4 fields)";
        goto out;
    }
    if (type_len != 1 || (type[0] != 'K' && type[0] != 'S')) {
        *why = "unknown record type (written by a newer idem?)";
        goto out;
    }
    if (parse_decimal(ms, ms_len, INT64_MAX, &when) < 0) {
        *why = "malformed timestamp";
        goto out;
    }
    name = decode(name_f, name_len, &nomem);
    if (!name || name[0] == '\0' || strlen(name) > IDEM_CLIENT_INTENT_MAX) {
        *why = "malformed intent name";
        goto out;
    }
    it = find(t, name);
    if (type[0] == 'K') {
        key = decode(last, last_len, &nomem);
        if (!key || idem_client_key_check(key, NULL) < 0) {
            *why = "malformed key";
            goto out;
        }
        if (it) {
            /* The same record twice is harmless; two keys for one intent are not. */
            if (strcmp(it->key, key) != 0) {
                *why = "intent journaled a second time with another key";
                goto out;
            }
            rc = 0;
            goto out;
        }
        if (!table_add(t, name, key, when)) {
            rc = IDEM_CLIENT_ENOMEM;
            goto out;
        }
        name = NULL;
        key = NULL;
    } else {
        if (parse_decimal(last, last_len, 999, &status) < 0 || status < 100) {
            *why = "malformed status";
            goto out;
        }
        if (!it) {
            *why = "status recorded for an intent without a key";
            goto out;
        }
        if (!is_2xx(it->final_status))
            it->final_status = (int)status;
    }
    rc = 0;
out:
    if (nomem)
        rc = IDEM_CLIENT_ENOMEM;
    free(name);
    free(key);
    return rc;
}

/*
 * Checks one line (without its newline) and applies it.  Returns 0, IDEM_CLIENT_ECORRUPT with
 * *why set, or IDEM_CLIENT_ENOMEM.
 */
static int parse_line(struct table *t, const char *line, size_t len, const char **why)
{
    int64_t declared;
    uint32_t crc = 0;
    size_t i, digits;
    int h;

    if (len > LINE_MAX_BYTES) {
        *why = "record too long";
        return IDEM_CLIENT_ECORRUPT;
    }
    if (len < 11 || line[8] != ' ') {
        *why = "malformed record (no checksum)";
        return IDEM_CLIENT_ECORRUPT;
    }
    for (i = 0; i < 8; i++) {
        h = hex_value(line[i]);
        if (h < 0 || (line[i] >= 'A' && line[i] <= 'F')) {
            *why = "malformed record (no checksum)";
            return IDEM_CLIENT_ECORRUPT;
        }
        crc = (crc << 4) | (uint32_t)h;
    }
    for (digits = 0; 9 + digits < len && line[9 + digits] != ' '; digits++)
        ;
    if (9 + digits >= len || parse_decimal(line + 9, digits, LINE_MAX_BYTES, &declared) < 0) {
        *why = "malformed record (no length)";
        return IDEM_CLIENT_ECORRUPT;
    }
    i = 9 + digits + 1; /* start of the payload */
    if ((size_t)declared != len - i) {
        *why = (size_t)declared > len - i ? "record shorter than its length says (cut short?)"
                                          : "record longer than its length says";
        return IDEM_CLIENT_ECORRUPT;
    }
    if (idem_client__crc32(0, line + i, len - i) != crc) {
        *why = "checksum mismatch (the record was damaged)";
        return IDEM_CLIENT_ECORRUPT;
    }
    return apply(t, line + i, len - i, why);
}

/*
 * Brings the table up to date with the file; the caller holds the lock.  Only the bytes appended
 * since the last call are read, unless the file is another one (compacted by another process) or
 * shorter than what was read: then it is read whole, into a fresh table.  A damaged record stops
 * the journal: the table is dropped, so every later call reads the file again and reports it.
 */
static int reload(struct idem_client_journal *j)
{
    int rc = IDEM_CLIENT_EJOURNAL;
    struct table fresh = {NULL, 0, 0, NULL, 0};
    struct table *t = &j->t;
    char *data = NULL;
    struct stat st;
    size_t size = 0, off = 0, b = 0, e;
    size_t lineno = 0;
    off_t from;
    ssize_t got;
    const char *why = NULL;

    if (fstat(j->fd, &st) != 0) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: cannot stat: %s", j->path,
                         strerror(errno));
        goto out;
    }
    from = j->loaded;
    if (st.st_dev != j->dev || st.st_ino != j->ino || st.st_size < j->loaded || j->loaded == 0) {
        from = 0;
        t = &fresh;
        if ((uint64_t)st.st_size > JOURNAL_MAX_BYTES) {
            idem_client__fmt(j->errmsg, sizeof j->errmsg,
                             "%s: journal larger than %u MiB (compact it: idem journal compact)",
                             j->path, JOURNAL_MAX_BYTES >> 20);
            rc = IDEM_CLIENT_ETOOBIG;
            goto out;
        }
    }
    if (st.st_size == from) {
        rc = 0;
        goto swap;
    }
    size = (size_t)(st.st_size - from);
    data = malloc(size + 1);
    if (!data) {
        rc = IDEM_CLIENT_ENOMEM;
        goto out;
    }
    while (off < size) {
        got = pread(j->fd, data + off, size - off, from + (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: cannot read: %s", j->path,
                             strerror(errno));
            goto out;
        }
        if (got == 0)
            break; /* shrank under us: read what is there */
        off += (size_t)got;
    }
    size = off;
    for (b = 0; b < size; b = e + 1) {
        lineno++;
        for (e = b; e < size && data[e] != '\n'; e++)
            ;
        if (e == size) {
            /* Every append ends with its newline: a last line without one was cut short. */
            why = "truncated record at the end of the file (an append was cut short)";
            rc = IDEM_CLIENT_ECORRUPT;
            goto bad;
        }
        rc = parse_line(t, data + b, e - b, &why);
        if (rc == IDEM_CLIENT_ECORRUPT)
            goto bad;
        if (rc < 0)
            goto drop;
    }
    rc = 0;
swap:
    if (t == &fresh) {
        table_clear(&j->t);
        j->t = fresh;
        memset(&fresh, 0, sizeof fresh);
    }
    j->loaded = from + (off_t)size;
    j->dev = st.st_dev;
    j->ino = st.st_ino;
    goto out;
bad:
    if (from > 0) {
        /* Found in an appended tail: read the file whole, for the damaged line's number. */
        table_clear(&j->t);
        j->loaded = 0;
        table_clear(&fresh);
        free(data);
        return reload(j);
    }
    idem_client__fmt(j->errmsg, sizeof j->errmsg,
                     "%s:%zu: %s; the journal is not used until this line is repaired or removed",
                     j->path, lineno, why);
drop:
    /* Part of the tail may be in the table: start again from nothing next time. */
    table_clear(&j->t);
    j->loaded = 0;
out:
    table_clear(&fresh);
    free(data);
    return rc;
}

/* ---- locking and appending --------------------------------------------------------------------
 */

static int lock(struct idem_client_journal *j, int how)
{
    while (flock(j->fd, how) != 0) {
        if (errno == EINTR)
            continue;
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: cannot lock: %s", j->path,
                         strerror(errno));
        return IDEM_CLIENT_EJOURNAL;
    }
    return 0;
}

static void unlock(struct idem_client_journal *j)
{
    (void)flock(j->fd, LOCK_UN);
}

/*
 * Locks, then reads what other processes appended since.  When another process compacted the
 * journal, the path names a new file while `fd` still holds the old one: it is opened again, and
 * locked again, before anything is read.
 */
static int lock_and_reload(struct idem_client_journal *j, int how)
{
    for (int tries = 0;; tries++) {
        struct stat by_path, by_fd;
        int rc = lock(j, how);
        int fd;

        if (rc < 0)
            return rc;
        if (stat(j->path, &by_path) != 0 || fstat(j->fd, &by_fd) != 0 ||
            (by_path.st_dev == by_fd.st_dev && by_path.st_ino == by_fd.st_ino) || tries == 8)
            break;
        unlock(j);
        fd = open(j->path, O_RDWR | O_APPEND | O_CLOEXEC);
        if (fd < 0) {
            idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: cannot open: %s", j->path,
                             strerror(errno));
            return IDEM_CLIENT_EJOURNAL;
        }
        close(j->fd);
        j->fd = fd;
    }
    {
        int rc = reload(j);
        if (rc < 0)
            unlock(j);
        return rc;
    }
}

/*
 * One record as a line: CRC-32 and length of the payload, then the payload (type, time, the
 * percent-encoded intent and last field), then a newline.  Returns its length, or 0.
 */
static size_t format_line(char type, int64_t ms, const char *name, const char *last,
                          char line[LINE_MAX_BYTES + 32])
{
    char payload[LINE_MAX_BYTES];
    size_t p, len;
    int n;

    n = snprintf(payload, sizeof payload, "%c %lld ", type, (long long)ms);
    if (n < 0)
        return 0;
    p = (size_t)n;
    encode(payload, &p, name);
    payload[p++] = ' ';
    encode(payload, &p, last);
    n = snprintf(line, LINE_MAX_BYTES + 32, "%08x %zu ",
                 (unsigned)idem_client__crc32(0, payload, p), p);
    if (n < 0)
        return 0;
    len = (size_t)n;
    memcpy(line + len, payload, p);
    len += p;
    line[len++] = '\n';
    return len;
}

/* Writes all of `buf` to `fd`; 0, or -1 with errno. */
static int write_all(int fd, const char *buf, size_t len)
{
    size_t off = 0;

    while (off < len) {
        ssize_t put = write(fd, buf + off, len - off);
        if (put < 0 && errno == EINTR)
            continue;
        if (put < 0)
            return -1;
        off += (size_t)put;
    }
    return 0;
}

/*
 * Appends one record: a single write of the whole line, then fsync.  The caller holds the lock
 * and has just reloaded, so the line lands right after what the table holds.
 */
static int append(struct idem_client_journal *j, char type, const char *name, const char *last)
{
    char line[LINE_MAX_BYTES + 32];
    size_t len = format_line(type, clock_wall_ms(), name, last, line);

    if (len == 0)
        return IDEM_CLIENT_EINVAL;
    if (write_all(j->fd, line, len) != 0) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: cannot append: %s", j->path,
                         strerror(errno));
        return IDEM_CLIENT_EJOURNAL;
    }
    if (j->fsync_fn(j->fd) != 0) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: fsync failed: %s", j->path,
                         strerror(errno));
        return IDEM_CLIENT_EJOURNAL;
    }
    j->loaded += (off_t)len;
    return 0;
}

/* fsyncs the directory holding `path`, so that a new file's name survives a crash too. */
static void sync_parent_dir(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t n;
    int fd;

    if (!slash) {
        dir[0] = '.';
        dir[1] = '\0';
    } else {
        n = (size_t)(slash - path);
        if (n == 0)
            n = 1; /* "/journal" lives in "/" */
        if (n >= sizeof dir)
            return;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    (void)fsync(fd);
    close(fd);
}

/* ---- compaction ---------------------------------------------------------------------------
 */

/*
 * Rewrites the journal without the intents `drop` says (the caller holds LOCK_EX and has just
 * reloaded): the kept records go to a new file, fsync'd, renamed over the journal and the
 * directory fsync'd, so a crash at any point leaves the old journal or the new one, whole.
 * Other processes notice the new file at their next lock (lock_and_reload).
 */
static int rewrite(struct idem_client_journal *j, int64_t cutoff_ms, size_t *dropped, size_t *kept)
{
    char tmp[PATH_MAX];
    char line[LINE_MAX_BYTES + 32];
    char status[16];
    struct table t = {NULL, 0, 0, NULL, 0};
    struct stat st;
    int fd = -1, rc = IDEM_CLIENT_EJOURNAL;
    off_t size = 0;

    *dropped = *kept = 0;
    if (strlen(j->path) + 32 > sizeof tmp) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: path too long", j->path);
        return IDEM_CLIENT_EINVAL;
    }
    idem_client__fmt(tmp, sizeof tmp, "%s.compact-%ld", j->path, (long)getpid());
    fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: cannot create: %s", tmp,
                         strerror(errno));
        return IDEM_CLIENT_EJOURNAL;
    }
    for (size_t i = 0; i < j->t.n; i++) {
        const struct idem_client_intent *it = &j->t.items[i];
        size_t len;
        char *name, *key;
        /* Only a finished intent may go: an unfinished one may still be retried. */
        if (it->final_status != 0 && it->created_ms < cutoff_ms) {
            (*dropped)++;
            continue;
        }
        len = format_line('K', it->created_ms, it->name, it->key, line);
        if (len == 0 || write_all(fd, line, len) != 0)
            goto io;
        size += (off_t)len;
        if (it->final_status != 0) {
            idem_client__fmt(status, sizeof status, "%d", it->final_status);
            len = format_line('S', it->created_ms, it->name, status, line);
            if (len == 0 || write_all(fd, line, len) != 0)
                goto io;
            size += (off_t)len;
        }
        name = idem_client__strdup(it->name);
        key = idem_client__strdup(it->key);
        if (!name || !key || !table_add(&t, name, key, it->created_ms)) {
            free(name);
            free(key);
            rc = IDEM_CLIENT_ENOMEM;
            goto fail;
        }
        t.items[t.n - 1].final_status = it->final_status;
        (*kept)++;
    }
    if (j->fsync_fn(fd) != 0 || fstat(fd, &st) != 0)
        goto io;
    if (rename(tmp, j->path) != 0)
        goto io;
    sync_parent_dir(j->path);
    /* The new file is the journal now; the old one's lock goes with its descriptor. */
    close(j->fd);
    j->fd = fd;
    fd = -1;
    if (lock(j, LOCK_EX) < 0) {
        j->loaded = 0;
        rc = IDEM_CLIENT_EJOURNAL;
        goto fail;
    }
    table_clear(&j->t);
    j->t = t;
    memset(&t, 0, sizeof t);
    j->loaded = size;
    j->dev = st.st_dev;
    j->ino = st.st_ino;
    j->compacted_size = size;
    return 0;
io:
    idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: cannot write the compacted journal: %s", tmp,
                     strerror(errno));
    rc = IDEM_CLIENT_EJOURNAL;
fail:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    table_clear(&t);
    return rc;
}

/*
 * After an append, past the size limit: drops finished intents older than a week.  A failure is
 * not the caller's (its record is written); the next append tries again.  A journal that did not
 * shrink is not rewritten again until it doubles.
 */
static void compact_if_large(struct idem_client_journal *j)
{
    size_t dropped, kept;
    char saved[IDEM_CLIENT_ERRMSG_MAX];

    if (j->compact_bytes == 0 || (size_t)j->loaded < j->compact_bytes ||
        j->loaded < 2 * j->compacted_size)
        return;
    memcpy(saved, j->errmsg, sizeof saved);
    if (rewrite(j, clock_wall_ms() - JOURNAL_COMPACT_AGE_MS, &dropped, &kept) < 0)
        j->compacted_size = j->loaded; /* wait until it doubles before trying again */
    memcpy(j->errmsg, saved, sizeof saved);
}

/* ---- the API ----------------------------------------------------------------------------------
 */

int idem_client_journal_open(const char *path, struct idem_client_journal **out, char **errmsg)
{
    int rc = IDEM_CLIENT_ENOMEM;
    struct idem_client_journal *j = NULL;
    int created = 0;

    if (out)
        *out = NULL;
    if (errmsg)
        *errmsg = NULL;
    if (!path || !out || path[0] == '\0') {
        rc = IDEM_CLIENT_EINVAL;
        if (errmsg)
            *errmsg = idem_client__strdup("no journal path");
        goto out;
    }
    j = calloc(1, sizeof *j);
    if (!j)
        goto out;
    j->fd = -1;
    j->fsync_fn = fsync;
    j->compact_bytes = JOURNAL_COMPACT_BYTES;
    j->path = idem_client__strdup(path);
    if (!j->path)
        goto out;
    j->fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (j->fd >= 0)
        created = 1;
    else if (errno == EEXIST)
        j->fd = open(path, O_RDWR | O_APPEND | O_CLOEXEC);
    if (j->fd < 0) {
        rc = IDEM_CLIENT_EJOURNAL;
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    if (created)
        sync_parent_dir(path);
    rc = lock_and_reload(j, LOCK_SH);
    if (rc < 0)
        goto out;
    unlock(j);
    *out = j;
    j = NULL;
out:
    if (j && errmsg)
        *errmsg = idem_client__strdup(j->errmsg[0] ? j->errmsg : idem_client_strerror(rc));
    idem_client_journal_close(j);
    return rc;
}

void idem_client_journal_close(struct idem_client_journal *j)
{
    if (!j)
        return;
    if (j->fd >= 0)
        close(j->fd);
    table_clear(&j->t);
    free(j->path);
    free(j);
}

const char *idem_client_journal_path(const struct idem_client_journal *j)
{
    return j ? j->path : NULL;
}

const char *idem_client_journal_errmsg(const struct idem_client_journal *j)
{
    return j ? j->errmsg : "";
}

static int check_intent(struct idem_client_journal *j, const char *intent)
{
    size_t n = intent ? strlen(intent) : 0;

    if (n == 0 || n > IDEM_CLIENT_INTENT_MAX) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "intent name must be 1 to %d bytes",
                         IDEM_CLIENT_INTENT_MAX);
        return IDEM_CLIENT_EINVAL;
    }
    return 0;
}

int idem_client_journal_lookup(struct idem_client_journal *j, const char *intent,
                               const struct idem_client_intent **out)
{
    int rc = IDEM_CLIENT_EINVAL;
    struct idem_client_intent *it;

    if (!j || !out)
        goto out;
    *out = NULL;
    j->errmsg[0] = '\0';
    rc = check_intent(j, intent);
    if (rc < 0)
        goto out;
    rc = lock_and_reload(j, LOCK_SH);
    if (rc < 0)
        goto out;
    unlock(j);
    it = find(&j->t, intent);
    if (it) {
        j->view = *it;
        j->view.created = 0;
        *out = &j->view;
    }
out:
    return rc;
}

int idem_client_journal_begin(struct idem_client_journal *j, const char *intent, const char *key,
                              const struct idem_client_intent **out)
{
    int rc = IDEM_CLIENT_EINVAL;
    int locked = 0;
    struct idem_client_intent *it;
    char uuid[IDEM_CLIENT_UUID_LEN + 1];
    const char *why = NULL;
    char *name_copy = NULL, *key_copy = NULL;

    if (!j || !out)
        goto out;
    *out = NULL;
    j->errmsg[0] = '\0';
    rc = check_intent(j, intent);
    if (rc < 0)
        goto out;
    if (key && idem_client_key_check(key, &why) < 0) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s", why);
        rc = IDEM_CLIENT_EKEY;
        goto out;
    }
    rc = lock_and_reload(j, LOCK_EX);
    if (rc < 0)
        goto out;
    locked = 1;
    it = find(&j->t, intent);
    if (it) {
        if (key && strcmp(key, it->key) != 0) {
            idem_client__fmt(j->errmsg, sizeof j->errmsg,
                             "%s: intent is journaled with key %s, not %s", j->path, it->key, key);
            rc = IDEM_CLIENT_EINTENT;
            goto out;
        }
        j->view = *it;
        j->view.created = 0;
        *out = &j->view;
        rc = 0;
        goto out;
    }
    if (!key) {
        rc = idem_client_key_new(uuid);
        if (rc < 0)
            goto out;
        key = uuid;
    }
    rc = IDEM_CLIENT_ENOMEM;
    name_copy = idem_client__strdup(intent);
    key_copy = idem_client__strdup(key);
    if (!name_copy || !key_copy)
        goto out;
    rc = append(j, 'K', intent, key);
    if (rc < 0)
        goto out;
    it = table_add(&j->t, name_copy, key_copy, clock_wall_ms());
    if (!it) {
        /* On disk but not in memory: the next call reads the file again. */
        j->loaded = 0;
        rc = IDEM_CLIENT_ENOMEM;
        goto out;
    }
    name_copy = NULL;
    key_copy = NULL;
    compact_if_large(j);
    it = find(&j->t, intent);
    j->view = *it;
    j->view.created = 1;
    *out = &j->view;
    rc = 0;
out:
    if (locked)
        unlock(j);
    free(name_copy);
    free(key_copy);
    return rc;
}

int idem_client_journal_finish(struct idem_client_journal *j, const char *intent, int status)
{
    int rc = IDEM_CLIENT_EINVAL;
    int locked = 0;
    struct idem_client_intent *it;
    char text[16];

    if (!j)
        goto out;
    j->errmsg[0] = '\0';
    rc = check_intent(j, intent);
    if (rc < 0)
        goto out;
    if (status < 100 || status > 999) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "status %d is not an HTTP status", status);
        rc = IDEM_CLIENT_EINVAL;
        goto out;
    }
    rc = lock_and_reload(j, LOCK_EX);
    if (rc < 0)
        goto out;
    locked = 1;
    it = find(&j->t, intent);
    if (!it) {
        idem_client__fmt(j->errmsg, sizeof j->errmsg, "%s: intent is not journaled", j->path);
        rc = IDEM_CLIENT_EINVAL;
        goto out;
    }
    rc = 0;
    if (it->final_status == status || is_2xx(it->final_status))
        goto out;
    idem_client__fmt(text, sizeof text, "%d", status);
    rc = append(j, 'S', intent, text);
    if (rc < 0)
        goto out;
    it->final_status = status;
    compact_if_large(j);
out:
    if (locked)
        unlock(j);
    return rc;
}

size_t idem_client_journal_count(const struct idem_client_journal *j)
{
    return j ? j->t.n : 0;
}

const struct idem_client_intent *idem_client_journal_at(const struct idem_client_journal *j,
                                                        size_t i)
{
    return j && i < j->t.n ? &j->t.items[i] : NULL;
}

void idem_client__journal_set_fsync(struct idem_client_journal *j, int (*fsync_fn)(int fd))
{
    if (j)
        j->fsync_fn = fsync_fn ? fsync_fn : fsync;
}

void idem_client__journal_set_compact_bytes(struct idem_client_journal *j, size_t bytes)
{
    if (j)
        j->compact_bytes = bytes;
}

int idem_client_journal_compact(struct idem_client_journal *j, int64_t older_than_ms,
                                size_t *dropped, size_t *kept)
{
    size_t d = 0, k = 0;
    int rc;

    if (dropped)
        *dropped = 0;
    if (kept)
        *kept = 0;
    if (!j || older_than_ms < 0)
        return IDEM_CLIENT_EINVAL;
    j->errmsg[0] = '\0';
    rc = lock_and_reload(j, LOCK_EX);
    if (rc < 0)
        return rc;
    rc = rewrite(j, clock_wall_ms() - older_than_ms, &d, &k);
    unlock(j);
    if (rc == 0) {
        if (dropped)
            *dropped = d;
        if (kept)
            *kept = k;
    }
    return rc;
}
