/* SPDX-License-Identifier: Apache-2.0 */
/*
 * auth.c - bearer tokens: creating them (`orderd token create`) and resolving a request's
 * Authorization header to a user id.  Only SHA-256 hashes are stored and looked up: the token
 * itself exists once, on the stdout of the command that made it.
 */
#include "auth.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idem/idem.h"

#include "log.h"
#include "strbuf.h"
#include "util.h"
#include "banned.h"

#define TOKEN_RANDOM_BYTES 32
#define TOKEN_MAX_LEN 512
#define DIGEST_LEN SHA256_BYTES
#define CACHE_STRIPES 16
#define CACHE_USER_MAX 63 /* user ids are "usr_" and 32 hex digits; longer ones are not cached */

static void token_hash(const char *token, size_t len, char hex[AUTH_HASH_HEX_LEN + 1])
{
    unsigned char md[DIGEST_LEN];

    sha256_bytes(token, len, md);
    hex_encode(md, DIGEST_LEN, hex);
}

/* ---- the token cache ------------------------------------------------------------------------- */

struct auth_slot {
    unsigned char digest[DIGEST_LEN];
    char user[CACHE_USER_MAX + 1]; /* "" in the table of unknown tokens */
    int64_t until_ms;              /* CLOCK_MONOTONIC; 0: empty */
};

struct auth_cache {
    int64_t ttl_ms;
    size_t nslots;
    struct auth_slot *slots;   /* known tokens */
    struct auth_slot *unknown; /* tokens the store did not know, for AUTH_NEGATIVE_TTL_MS */
    pthread_mutex_t stripes[CACHE_STRIPES];
    /* Store reads in progress for tokens the cache does not know, at most max_lookups. */
    pthread_mutex_t lookup_mu;
    pthread_cond_t lookup_cv;
    int lookups;
    int max_lookups;
};

/* How long a token lookup waits for one of the allowed slots before AUTH_BUSY. */
#define LOOKUP_WAIT_MS 2000

struct auth_cache *auth_cache_new(int64_t ttl_ms, size_t slots, int max_lookups)
{
    struct auth_cache *c = NULL;
    size_t i;

    if (ttl_ms <= 0 || slots == 0)
        return NULL;
    c = xcalloc(1, sizeof *c);
    c->ttl_ms = ttl_ms;
    c->nslots = slots;
    c->slots = xcalloc(slots, sizeof *c->slots);
    c->unknown = xcalloc(slots, sizeof *c->unknown);
    c->max_lookups = max_lookups > 0 ? max_lookups : INT_MAX;
    if (pthread_mutex_init(&c->lookup_mu, NULL) != 0 || pthread_cond_init(&c->lookup_cv, NULL) != 0)
        die("cannot initialise a mutex");
    for (i = 0; i < CACHE_STRIPES; i++) {
        if (pthread_mutex_init(&c->stripes[i], NULL) != 0)
            die("cannot initialise a mutex");
    }
    return c;
}

void auth_cache_free(struct auth_cache *c)
{
    size_t i;

    if (c == NULL)
        return;
    for (i = 0; i < CACHE_STRIPES; i++)
        pthread_mutex_destroy(&c->stripes[i]);
    pthread_mutex_destroy(&c->lookup_mu);
    pthread_cond_destroy(&c->lookup_cv);
    free(c->slots);
    free(c->unknown);
    free(c);
}

/* A SHA-256 is uniformly spread: its first bytes pick the slot, no other hash is needed. */
static size_t slot_of(const struct auth_cache *c, const unsigned char md[DIGEST_LEN])
{
    uint64_t v;

    memcpy(&v, md, sizeof v);
    return (size_t)(v % c->nslots);
}

/*
 * Takes one of the slots for a store lookup, waiting up to LOOKUP_WAIT_MS: a burst of requests
 * with a real token the cache has not seen yet waits a moment; a flood of made-up tokens waits
 * behind its own slots and never holds more than max_lookups connections.  0, or -1 (busy).
 */
static int lookup_enter(struct auth_cache *c)
{
    struct timespec until;
    int rc = 0;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += LOOKUP_WAIT_MS / 1000;
    until.tv_nsec += (long)(LOOKUP_WAIT_MS % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->lookup_mu);
    while (c->lookups >= c->max_lookups && rc == 0)
        rc = pthread_cond_timedwait(&c->lookup_cv, &c->lookup_mu, &until) == 0 ? 0 : -1;
    if (c->lookups < c->max_lookups) {
        c->lookups++;
        rc = 0;
    }
    pthread_mutex_unlock(&c->lookup_mu);
    return rc;
}

static void lookup_leave(struct auth_cache *c)
{
    pthread_mutex_lock(&c->lookup_mu);
    c->lookups--;
    pthread_cond_signal(&c->lookup_cv);
    pthread_mutex_unlock(&c->lookup_mu);
}

/* Whether digest `md` is remembered as unknown to the store. */
static int cache_unknown(struct auth_cache *c, const unsigned char md[DIGEST_LEN])
{
    size_t i = slot_of(c, md);
    struct auth_slot *s = &c->unknown[i];
    pthread_mutex_t *mu = &c->stripes[i % CACHE_STRIPES];
    int hit;

    pthread_mutex_lock(mu);
    hit = s->until_ms > clock_mono_ms() && memcmp(s->digest, md, DIGEST_LEN) == 0;
    pthread_mutex_unlock(mu);
    return hit;
}

static void cache_put_unknown(struct auth_cache *c, const unsigned char md[DIGEST_LEN])
{
    size_t i = slot_of(c, md);
    struct auth_slot *s = &c->unknown[i];
    pthread_mutex_t *mu = &c->stripes[i % CACHE_STRIPES];

    pthread_mutex_lock(mu);
    memcpy(s->digest, md, DIGEST_LEN);
    s->until_ms = clock_mono_ms() + AUTH_NEGATIVE_TTL_MS;
    pthread_mutex_unlock(mu);
}

/* The cached user of digest `md` (new), or NULL. */
static char *cache_get(struct auth_cache *c, const unsigned char md[DIGEST_LEN])
{
    size_t i = slot_of(c, md);
    struct auth_slot *s = &c->slots[i];
    pthread_mutex_t *mu = &c->stripes[i % CACHE_STRIPES];
    int64_t now = clock_mono_ms();
    char *user = NULL;

    pthread_mutex_lock(mu);
    if (s->until_ms > now && memcmp(s->digest, md, DIGEST_LEN) == 0)
        user = xstrdup(s->user);
    pthread_mutex_unlock(mu);
    return user;
}

static void cache_insert(struct auth_cache *c, const unsigned char md[DIGEST_LEN], const char *user)
{
    size_t i = slot_of(c, md);
    struct auth_slot *s = &c->slots[i];
    pthread_mutex_t *mu = &c->stripes[i % CACHE_STRIPES];
    size_t len = strlen(user);

    if (len > CACHE_USER_MAX)
        return;
    pthread_mutex_lock(mu);
    memcpy(s->digest, md, DIGEST_LEN);
    memcpy(s->user, user, len + 1);
    /* Counted from after the store answered: the row was there at least until then. */
    s->until_ms = clock_mono_ms() + c->ttl_ms;
    pthread_mutex_unlock(mu);
}

/* Finds the token in "Bearer <token>": the scheme is case-insensitive, spaces around are ok. */
static int bearer_token(const char *value, const char **tok, size_t *len)
{
    const char *p = value;
    const char *end;
    int rc = -1;

    while (*p == ' ' || *p == '\t')
        p++;
    if (!ascii_ncaseeq(p, "Bearer", 6) || (p[6] != ' ' && p[6] != '\t'))
        goto out;
    p += 6;
    while (*p == ' ' || *p == '\t')
        p++;
    end = p + strlen(p);
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (end == p || (size_t)(end - p) > TOKEN_MAX_LEN)
        goto out;
    /* Only the shape `token create` makes can be in the store: anything else is not looked up. */
    if ((size_t)(end - p) != strlen(AUTH_TOKEN_PREFIX) + 2 * TOKEN_RANDOM_BYTES ||
        memcmp(p, AUTH_TOKEN_PREFIX, strlen(AUTH_TOKEN_PREFIX)) != 0)
        goto out;
    for (const char *q = p + strlen(AUTH_TOKEN_PREFIX); q < end; q++)
        if (!((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'f')))
            goto out;
    *tok = p;
    *len = (size_t)(end - p);
    rc = 0;
out:
    return rc;
}

int auth_principal(struct auth_cache *cache, struct idem_store *st, const char *authorization,
                   char **user_id)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    unsigned char md[DIGEST_LEN];
    char hex[AUTH_HASH_HEX_LEN + 1];
    const char *params[1];
    const char *tok = NULL;
    const char *uid;
    size_t len = 0;
    int counted = 0;
    int rc;

    *user_id = NULL;
    if (authorization == NULL || bearer_token(authorization, &tok, &len) != 0) {
        rc = 1;
        goto out;
    }
    sha256_bytes(tok, len, md);
    if (cache != NULL) {
        *user_id = cache_get(cache, md);
        if (*user_id != NULL) {
            rc = 0;
            goto out;
        }
    }
    if (cache != NULL && cache_unknown(cache, md)) {
        rc = 1;
        goto out;
    }
    if (st == NULL) {
        rc = AUTH_ASK_STORE;
        goto out;
    }
    if (cache != NULL) {
        if (lookup_enter(cache) != 0) {
            rc = AUTH_BUSY;
            goto out;
        }
        counted = 1;
        /* While it waited, another request may have looked this very token up. */
        *user_id = cache_get(cache, md);
        if (*user_id != NULL || cache_unknown(cache, md)) {
            rc = *user_id != NULL ? 0 : 1;
            goto out;
        }
    }
    hex_encode(md, DIGEST_LEN, hex);
    rc = idem_tx_begin(st, 0, &tx);
    if (rc < 0)
        goto out;
    params[0] = hex;
    rc = idem_tx_exec(tx, "SELECT user_id FROM tokens WHERE hash = $1", 1, params, &rows);
    if (rc < 0)
        goto out;
    uid = idem_rows_count(rows) > 0 ? idem_rows_get(rows, 0, 0) : NULL;
    if (uid == NULL) {
        if (cache != NULL)
            cache_put_unknown(cache, md);
        rc = 1;
        goto out;
    }
    if (cache != NULL)
        cache_insert(cache, md, uid);
    *user_id = xstrdup(uid);
    rc = 0;
out:
    if (counted)
        lookup_leave(cache);
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}

int auth_token_create(struct idem_store *st, const char *name, char **token, char *err,
                      size_t errlen)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    unsigned char raw[TOKEN_RANDOM_BYTES];
    unsigned char uid_raw[16];
    char uid[4 + 2 * sizeof uid_raw + 1];
    char hex[2 * TOKEN_RANDOM_BYTES + 1];
    char hash[AUTH_HASH_HEX_LEN + 1];
    char now[ISO8601_LEN + 1];
    char *tok = NULL;
    const char *params[3];
    const char *existing;
    size_t toklen;
    int rc;

    *token = NULL;
    if (name == NULL || name[0] == '\0' || strlen(name) > 200) {
        snprintf(err, errlen, "the user name must be 1 to 200 bytes");
        rc = IDEM_EINVAL;
        goto out;
    }
    random_bytes(uid_raw, sizeof uid_raw);
    hex_encode(uid_raw, sizeof uid_raw, uid + 4);
    memcpy(uid, "usr_", 4);
    random_bytes(raw, sizeof raw);
    hex_encode(raw, sizeof raw, hex);
    toklen = strlen(AUTH_TOKEN_PREFIX) + strlen(hex);
    tok = xmalloc(toklen + 1);
    snprintf(tok, toklen + 1, "%s%s", AUTH_TOKEN_PREFIX, hex);
    token_hash(tok, toklen, hash);
    iso8601_ms(clock_wall_ms(), now);

    rc = idem_tx_begin(st, 1, &tx);
    if (rc < 0) {
        snprintf(err, errlen, "cannot begin a transaction: %s", idem_strerror(rc));
        goto out;
    }
    /* Insert-if-absent, then read back: the unique name decides, not a read before the write. */
    params[0] = uid;
    params[1] = name;
    rc = idem_tx_exec(tx,
                      "INSERT INTO users (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                      2, params, NULL);
    if (rc < 0)
        goto store_failed;
    rc = idem_tx_exec(tx, "SELECT id FROM users WHERE name = $1", 1, params + 1, &rows);
    if (rc < 0)
        goto store_failed;
    existing = idem_rows_count(rows) > 0 ? idem_rows_get(rows, 0, 0) : NULL;
    if (existing == NULL) {
        snprintf(err, errlen, "user '%s' vanished while its token was made", name);
        rc = IDEM_ESTORE;
        goto out;
    }
    params[0] = hash;
    params[1] = existing;
    params[2] = now;
    rc = idem_tx_exec(tx, "INSERT INTO tokens (hash, user_id, created_at) VALUES ($1, $2, $3)", 3,
                      params, NULL);
    if (rc < 0)
        goto store_failed;
    rc = idem_tx_commit(tx);
    tx = NULL;
    if (rc < 0) {
        snprintf(err, errlen, "cannot commit: %s", idem_strerror(rc));
        goto out;
    }
    *token = tok;
    tok = NULL;
    goto out;
store_failed:
    snprintf(err, errlen, "%s: %s", idem_strerror(rc), idem_tx_errmsg(tx));
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    free(tok);
    return rc;
}

int auth_token_list(struct idem_store *st, const char *user, FILE *out, char *err, size_t errlen)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[1] = {user};
    struct strbuf name = STRBUF_INIT;
    int rc, n;

    rc = idem_tx_begin(st, 0, &tx);
    if (rc == 0)
        rc = idem_tx_exec(tx,
                          user ? "SELECT t.hash, u.name, t.created_at FROM tokens t"
                                 " JOIN users u ON u.id = t.user_id WHERE u.name = $1"
                                 " ORDER BY t.created_at, t.hash"
                               : "SELECT t.hash, u.name, t.created_at FROM tokens t"
                                 " JOIN users u ON u.id = t.user_id ORDER BY u.name, t.created_at,"
                                 " t.hash",
                          user ? 1 : 0, user ? params : NULL, &rows);
    if (rc < 0) {
        snprintf(err, errlen, "%s", tx ? idem_tx_errmsg(tx) : idem_strerror(rc));
        goto out;
    }
    n = idem_rows_count(rows);
    fprintf(out, "%-*s  %-24s  %s\n", AUTH_TOKEN_ID_LEN, "TOKEN ID", "CREATED", "USER");
    for (int i = 0; i < n; i++) {
        const char *hash = idem_rows_get(rows, i, 0);
        /* A user name is whatever `token create --user` was given: printed escaped. */
        strbuf_release(&name);
        log_escape_text(&name, idem_rows_get(rows, i, 1) ? idem_rows_get(rows, i, 1) : "");
        fprintf(out, "%.*s  %-24s  %s\n", AUTH_TOKEN_ID_LEN, hash ? hash : "?",
                idem_rows_get(rows, i, 2) ? idem_rows_get(rows, i, 2) : "-",
                name.buf ? name.buf : "");
    }
    rc = n;
out:
    strbuf_release(&name);
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}

int auth_token_revoke(struct idem_store *st, const char *user, const char *token_id,
                      const char *token, int *revoked, char *err, size_t errlen)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    char hex[AUTH_HASH_HEX_LEN + 1];
    char pattern[AUTH_HASH_HEX_LEN + 2];
    const char *params[1];
    const char *sql;
    const char *tok = NULL;
    size_t len = 0;
    int rc;

    *revoked = 0;
    if ((user != NULL) + (token_id != NULL) + (token != NULL) != 1) {
        snprintf(err, errlen, "name exactly one of --user, --token-id, --token");
        return IDEM_EINVAL;
    }
    if (user) {
        params[0] = user;
        sql = "DELETE FROM tokens WHERE user_id IN (SELECT id FROM users WHERE name = $1)";
    } else if (token_id) {
        size_t n = strlen(token_id);
        if (n < 8 || n > AUTH_HASH_HEX_LEN || strspn(token_id, "0123456789abcdef") != n) {
            snprintf(err, errlen, "a token id is 8 to 64 lowercase hex digits (orderd token list)");
            return IDEM_EINVAL;
        }
        snprintf(pattern, sizeof pattern, "%s%%", token_id);
        params[0] = pattern;
        sql = "DELETE FROM tokens WHERE hash LIKE $1";
    } else {
        char header[TOKEN_MAX_LEN + 16];
        snprintf(header, sizeof header, "Bearer %s", token);
        if (bearer_token(header, &tok, &len) != 0) {
            snprintf(err, errlen, "that is not a token made by `orderd token create`");
            return IDEM_EINVAL;
        }
        token_hash(tok, len, hex);
        params[0] = hex;
        sql = "DELETE FROM tokens WHERE hash = $1";
    }
    rc = idem_tx_begin(st, 1, &tx);
    if (rc == 0)
        rc = idem_tx_exec(tx, sql, 1, params, &rows);
    if (rc < 0) {
        snprintf(err, errlen, "%s", tx ? idem_tx_errmsg(tx) : idem_strerror(rc));
        goto out;
    }
    *revoked = (int)idem_rows_changed(rows);
    if (token_id && *revoked > 1) {
        snprintf(err, errlen, "token id %s names %d tokens: give more of its digits", token_id,
                 *revoked);
        *revoked = 0;
        rc = IDEM_EINVAL;
        goto out; /* rolled back */
    }
    rc = idem_tx_commit(tx);
    tx = NULL;
    if (rc < 0)
        snprintf(err, errlen, "cannot commit: %s", idem_strerror(rc));
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}
