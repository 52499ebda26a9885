/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.c - idem-gateway's configuration reader (config.h): YAML text through libyaml's document
 * API into struct gw_config, every value checked against what the gateway can honour before the
 * program opens a socket or the store.
 *
 * The text is loaded by the programs' one strict YAML reader (src/util/strict_yaml.c), which
 * refuses what libyaml's document API would silently accept: aliases, a second document, nesting
 * deeper than any config needs (MAX_DEPTH).  The walk below reads each mapping through collect():
 * unknown and duplicate keys are refused there, in document order, so every later step sees one
 * value per key.
 *
 * Every message is one line, "<file>:<line>: <path>: <what is wrong, what is expected>", with the
 * line of the node at fault (libyaml's start_mark.line + 1).
 *
 * Why ~1,900 lines: one reader of one document, section by section (listen, store, upstream,
 * principal, limits, routes), every section through the same few helpers (collect(), want_*(),
 * fail()); the generic YAML part is src/util/strict_yaml.c.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "strict_yaml.h"
#include "util.h"
#include "banned.h"

#define CONFIG_MAX_BYTES ((size_t)1 << 20)    /* a real config is a few KiB */
#define KEY_FILE_MAX_BYTES ((size_t)64 << 10) /* a JWT secret or a PEM public key */
#define MAX_ROUTES 1000
#define MAX_DEPTH 16 /* the deepest config is 5 levels: routes[i].key.body */
#define MAX_KEYS 16  /* keys of the widest mapping (a route has 12) */
#define MAX_POINTERS 16
#define MAX_STORE_HEADERS 32
#define MAX_MATCH_LEN 512 /* also bounds the route-against-route comparisons */
#define MAX_NAME_LEN 256  /* header names, operation names are shorter still */
#define ADMIN_TOKEN_MIN 16
#define MAX_OPERATION_LEN 64
#define EXCERPT 48 /* bytes of a value quoted in a message */

#define KIB ((int64_t)1 << 10)
#define MIB ((int64_t)1 << 20)
#define GIB ((int64_t)1 << 30)
#define SECOND_MS ((int64_t)1000)
#define MINUTE_MS (60 * SECOND_MS)
#define HOUR_MS (60 * MINUTE_MS)
#define DAY_MS (24 * HOUR_MS)

#define DEFAULT_LISTEN "127.0.0.1:8180" /* clear of orderd (8080) and provider-sim (8090) */
#define DEFAULT_ADMIN_LISTEN "127.0.0.1:8181"
#define DEFAULT_STORE "sqlite:gateway.db"
#define DEFAULT_CONNECT_TIMEOUT_MS (2 * SECOND_MS)
#define DEFAULT_TIMEOUT_MS (30 * SECOND_MS)
#define DEFAULT_UPSTREAM_CONNECTIONS 64
#define DEFAULT_MAX_RESPONSE (16 * MIB)
#define DEFAULT_MAX_BODY MIB
#define DEFAULT_RETENTION_MS DAY_MS
#define DEFAULT_LEASE_MARGIN_MS (10 * SECOND_MS) /* over the upstream timeout */
#define DEFAULT_WAIT_MS (2 * SECOND_MS)
#define DEFAULT_MAX_STORED_BODY MIB
#define DEFAULT_KEY_HEADER "Idempotency-Key"
/* What one caller may make the gateway keep (principal_limits), and all of them together. */
#define DEFAULT_KEYS_IN_FLIGHT 512
#define DEFAULT_NEW_KEYS_PER_SECOND 1000
#define DEFAULT_PRINCIPAL_STORED GIB
#define DEFAULT_TRACKED 10000
#define DEFAULT_MAX_STORED (16 * GIB)

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const default_store_headers[] = {"Content-Type", "Location", "ETag", "Link"};
/* With error_format: stripe, replays also keep what Stripe's clients log and check. */
static const char *const stripe_store_headers[] = {"Request-Id", "Stripe-Version"};
/* The method-override headers of Express's method-override, Symfony, Rails and Google's APIs. */
static const char *const default_method_override_headers[] = {"X-HTTP-Method-Override",
                                                              "X-HTTP-Method", "X-Method-Override"};

/* Statuses of 2xx and 4xx that are not stored by default: each says nothing about the write. */
static const int default_unstored[] = {400, 401, 403, 408, 413, 415, 429};

/* What later routes are compared with. */
struct seen_route {
    char *shape;        /* "POST /v1/orders/{}/refunds": the match with its parameters blanked */
    int match_line;     /* where that match is written */
    int operation_line; /* and that operation */
};

struct loader {
    const char *name; /* the file, for messages and for the key files' directory */
    yaml_document_t *doc;
    char *err;
    size_t errlen;
    struct seen_route *seen; /* per route read so far, for the duplicate checks */
    size_t nseen;
};

/* ---- messages -------------------------------------------------------------------------------- */

/*
 * Messages are one line: a control byte that came from the file (a "\n" escape in a quoted value)
 * becomes '?', and a UTF-8 sequence cut short by the truncation is dropped.
 */
static void one_line(char *s)
{
    size_t n = strlen(s), i, start, need;
    unsigned char lead;

    for (i = 0; i < n; i++) {
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            s[i] = '?';
    }
    if (n == 0)
        return;
    start = n - 1;
    while (start > 0 && n - start < 4 && ((unsigned char)s[start] & 0xc0) == 0x80)
        start--;
    lead = (unsigned char)s[start];
    need = lead < 0x80 ? 1 : (lead & 0xe0) == 0xc0 ? 2 : (lead & 0xf0) == 0xe0 ? 3 : 4;
    if (lead >= 0x80 && n - start < need)
        s[start] = '\0';
}

static int fail(struct loader *ld, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Writes "<file>:<line>: <message>" into the caller's buffer, or "<file>: <message>" for what is
 * about the whole file (line 0); returns -1 for `return fail(...)`.
 */
static int fail(struct loader *ld, int line, const char *fmt, ...)
{
    va_list ap;
    size_t n;

    if (ld->err == NULL || ld->errlen == 0)
        return -1;
    if (line > 0)
        snprintf(ld->err, ld->errlen, "%s:%d: ", ld->name, line);
    else
        snprintf(ld->err, ld->errlen, "%s: ", ld->name);
    n = strlen(ld->err);
    if (n + 1 < ld->errlen) {
        va_start(ap, fmt);
        vsnprintf(ld->err + n, ld->errlen - n, fmt, ap);
        va_end(ap);
    }
    one_line(ld->err);
    return -1;
}

/* At most EXCERPT bytes of `s` for a message, cut at a character boundary, "..." when cut. */
static const char *excerpt(const char *s, char out[EXCERPT + 4])
{
    size_t n = strlen(s);

    if (n <= EXCERPT) {
        memcpy(out, s, n + 1);
        return out;
    }
    n = EXCERPT;
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
        n--;
    memcpy(out, s, n);
    memcpy(out + n, "...", 4);
    return out;
}

static void fmt_duration(int64_t ms, char *out, size_t cap)
{
    static const struct {
        int64_t ms;
        const char *unit;
    } units[] = {{DAY_MS, "d"}, {HOUR_MS, "h"}, {MINUTE_MS, "m"}, {SECOND_MS, "s"}};
    size_t i;

    for (i = 0; i < COUNT(units); i++) {
        if (ms != 0 && ms % units[i].ms == 0) {
            snprintf(out, cap, "%lld%s", (long long)(ms / units[i].ms), units[i].unit);
            return;
        }
    }
    snprintf(out, cap, "%lldms", (long long)ms);
}

static void fmt_size(int64_t bytes, char *out, size_t cap)
{
    if (bytes != 0 && bytes % GIB == 0)
        snprintf(out, cap, "%lldGiB", (long long)(bytes / GIB));
    else if (bytes != 0 && bytes % MIB == 0)
        snprintf(out, cap, "%lldMiB", (long long)(bytes / MIB));
    else if (bytes != 0 && bytes % KIB == 0)
        snprintf(out, cap, "%lldKiB", (long long)(bytes / KIB));
    else if (bytes == 1)
        snprintf(out, cap, "1 byte");
    else
        snprintf(out, cap, "%lld bytes", (long long)bytes);
}

/* ---- nodes ----------------------------------------------------------------------------------- */

/* What a node is, for "expected X, not Y". */
static const char *describe(const yaml_node_t *n, char out[EXCERPT + 8])
{
    char shown[EXCERPT + 4];

    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (strict_yaml_is_null(n))
        return "an empty value";
    snprintf(out, EXCERPT + 8, "\"%s\"", excerpt(strict_yaml_text(n), shown));
    return out;
}

static yaml_node_t *node_at(struct loader *ld, int index)
{
    return yaml_document_get_node(ld->doc, index);
}

/* The number of items of a sequence node. */
static size_t nitems(const yaml_node_t *n)
{
    return (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
}

static yaml_node_t *item_at(struct loader *ld, const yaml_node_t *n, size_t i)
{
    return node_at(ld, n->data.sequence.items.start[i]);
}

/*
 * Reads mapping `map` whose keys may be `keys`: values[i] is the value of keys[i], or NULL.  An
 * unknown key, a repeated key or a key that is not a name is an error.  `where` names the mapping
 * in messages ("routes[2]"; "" for the top level).
 */
static int collect(struct loader *ld, const yaml_node_t *map, const char *where,
                   const char *const *keys, size_t nkeys, yaml_node_t **values)
{
    yaml_node_t *key_nodes[MAX_KEYS];
    const yaml_node_pair_t *pair;
    char place[96], expected[256], what[EXCERPT + 8], shown[EXCERPT + 4];
    size_t i, used;

    if (where[0] != '\0')
        snprintf(place, sizeof place, "in %s", where);
    else
        snprintf(place, sizeof place, "at the top level");
    if (map->type != YAML_MAPPING_NODE) {
        if (where[0] != '\0')
            return fail(ld, strict_yaml_line(map), "%s: expected a mapping, not %s", where,
                        describe(map, what));
        return fail(ld, strict_yaml_line(map), "expected a mapping at the top level, not %s",
                    describe(map, what));
    }
    for (i = 0; i < nkeys && i < MAX_KEYS; i++) {
        key_nodes[i] = NULL;
        values[i] = NULL;
    }
    for (pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top; pair++) {
        yaml_node_t *k = node_at(ld, pair->key), *v = node_at(ld, pair->value);

        if (k == NULL || v == NULL)
            return fail(ld, strict_yaml_line(map), "malformed YAML document");
        if (k->type != YAML_SCALAR_NODE || strict_yaml_is_null(k))
            return fail(ld, strict_yaml_line(k), "expected a key name %s, not %s", place,
                        describe(k, what));
        for (i = 0; i < nkeys && i < MAX_KEYS; i++) {
            if (k->data.scalar.length == strlen(keys[i]) &&
                strcmp(strict_yaml_text(k), keys[i]) == 0)
                break;
        }
        if (i == nkeys || i == MAX_KEYS) {
            expected[0] = '\0';
            used = 0;
            for (i = 0; i < nkeys && used < sizeof expected; i++) {
                snprintf(expected + used, sizeof expected - used, "%s%s", i ? ", " : "", keys[i]);
                used += strlen(expected + used);
            }
            return fail(ld, strict_yaml_line(k), "unknown key \"%s\" %s; expected one of: %s",
                        excerpt(strict_yaml_text(k), shown), place, expected);
        }
        if (key_nodes[i] != NULL)
            return fail(ld, strict_yaml_line(k), "duplicate key \"%s\" %s (first at line %d)",
                        keys[i], place, strict_yaml_line(key_nodes[i]));
        key_nodes[i] = k;
        values[i] = v;
    }
    return 0;
}

static int missing(struct loader *ld, const yaml_node_t *map, const char *where, const char *key,
                   const char *example)
{
    if (where[0] == '\0')
        return fail(ld, strict_yaml_line(map), "missing required key \"%s\" at the top level (%s)",
                    key, example);
    return fail(ld, strict_yaml_line(map), "%s: missing required key \"%s\" (%s)", where, key,
                example);
}

/* A scalar that is not null and holds no NUL byte; `what` says what was expected. */
static int want_text(struct loader *ld, const yaml_node_t *n, const char *path, const char *what,
                     const char **out)
{
    char shown[EXCERPT + 8];

    if (n->type != YAML_SCALAR_NODE || strict_yaml_is_null(n))
        return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, what,
                    describe(n, shown));
    if (strlen(strict_yaml_text(n)) != n->data.scalar.length)
        return fail(ld, strict_yaml_line(n), "%s: expected %s; the value holds a NUL byte", path,
                    what);
    *out = strict_yaml_text(n);
    return 0;
}

static int want_bool(struct loader *ld, const yaml_node_t *n, const char *path, int *out)
{
    static const char *const truths[] = {"true", "True", "TRUE"};
    static const char *const lies[] = {"false", "False", "FALSE"};
    const char *s;
    char shown[EXCERPT + 8];
    size_t i;

    if (want_text(ld, n, path, "true or false", &s) != 0)
        return -1;
    for (i = 0; i < COUNT(truths); i++) {
        if (strcmp(s, truths[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcmp(s, lies[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return fail(ld, strict_yaml_line(n), "%s: expected true or false, not %s", path,
                describe(n, shown));
}

static int want_int(struct loader *ld, const yaml_node_t *n, const char *path, int64_t min,
                    int64_t max, int64_t *out)
{
    char what[96], shown[EXCERPT + 8];
    const char *s;

    snprintf(what, sizeof what, "an integer from %lld to %lld", (long long)min, (long long)max);
    if (want_text(ld, n, path, what, &s) != 0)
        return -1;
    if (parse_int64(s, min, max, out) != 0)
        return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, what,
                    describe(n, shown));
    return 0;
}

struct unit {
    const char *suffix;
    int64_t scale;
};

/* "<digits><suffix>" with one of `units`; the digits times the unit's scale, without overflow. */
static int parse_scaled(const char *s, const struct unit *units, size_t nunits, int64_t *out)
{
    char digits[20];
    size_t n = strspn(s, "0123456789"), i;
    int64_t v;

    if (n == 0 || n >= sizeof digits)
        return -1;
    memcpy(digits, s, n);
    digits[n] = '\0';
    for (i = 0; i < nunits; i++) {
        if (strcmp(s + n, units[i].suffix) != 0)
            continue;
        if (parse_int64(digits, 0, INT64_MAX / units[i].scale, &v) != 0)
            return -1;
        *out = v * units[i].scale;
        return 0;
    }
    return -1;
}

/* A kind of scaled number: its units, how to say what is expected, how to show a bound. */
struct scale {
    const struct unit *units;
    size_t nunits;
    const char *what; /* "a duration such as 30s, 15m or 24h" */
    const char *kind; /* "duration" */
    void (*show)(int64_t v, char *out, size_t cap);
};

/* A number with a unit of `sc` in [min, max]. */
static int want_scaled(struct loader *ld, const yaml_node_t *n, const char *path,
                       const struct scale *sc, int64_t min, int64_t max, int64_t *out)
{
    char lo[32], hi[32], shown[EXCERPT + 8];
    const char *s;

    if (want_text(ld, n, path, sc->what, &s) != 0)
        return -1;
    if (parse_scaled(s, sc->units, sc->nunits, out) != 0)
        return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, sc->what,
                    describe(n, shown));
    if (*out < min || *out > max) {
        sc->show(min, lo, sizeof lo);
        sc->show(max, hi, sizeof hi);
        return fail(ld, strict_yaml_line(n), "%s: expected a %s from %s to %s, not %s", path,
                    sc->kind, lo, hi, describe(n, shown));
    }
    return 0;
}

/* A duration ("500ms", "30s", "15m", "24h", "7d"; a bare number is milliseconds) in [min, max]. */
static int want_duration(struct loader *ld, const yaml_node_t *n, const char *path, int64_t min,
                         int64_t max, int64_t *out)
{
    static const struct unit units[] = {{"", 1},          {"ms", 1},      {"s", SECOND_MS},
                                        {"m", MINUTE_MS}, {"h", HOUR_MS}, {"d", DAY_MS}};
    static const struct scale sc = {units, COUNT(units), "a duration such as 30s, 15m or 24h",
                                    "duration", fmt_duration};
    return want_scaled(ld, n, path, &sc, min, max, out);
}

/* A size (bytes, or "512KiB", "1MiB", "1GiB") in [min, max]. */
static int want_size(struct loader *ld, const yaml_node_t *n, const char *path, int64_t min,
                     int64_t max, int64_t *out)
{
    static const struct unit units[] = {{"", 1}, {"KiB", KIB}, {"MiB", MIB}, {"GiB", GIB}};
    static const struct scale sc = {units, COUNT(units), "a size such as 512KiB, 1MiB or 1GiB",
                                    "size", fmt_size};
    return want_scaled(ld, n, path, &sc, min, max, out);
}

/* RFC 9110 token: a header name. */
static int is_token(const char *s)
{
    size_t n = strlen(s);

    return n > 0 && n <= MAX_NAME_LEN &&
           strspn(s, "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                     "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == n;
}

static int want_header_name(struct loader *ld, const yaml_node_t *n, const char *path,
                            const char **out)
{
    static const char what[] = "a header name such as Idempotency-Key";
    char shown[EXCERPT + 8];

    if (want_text(ld, n, path, what, out) != 0)
        return -1;
    if (!is_token(*out))
        return fail(ld, strict_yaml_line(n), "%s: expected %s (an HTTP token), not %s", path, what,
                    describe(n, shown));
    return 0;
}

/* RFC 6901: "" (the whole document) or "/"-separated tokens where '~' is only ~0 or ~1. */
static int is_json_pointer(const char *s)
{
    if (s[0] != '\0' && s[0] != '/')
        return 0;
    for (; *s != '\0'; s++) {
        if (*s == '~' && s[1] != '0' && s[1] != '1')
            return 0;
    }
    return 1;
}

/* A non-empty list of JSON pointers, copied into *out. */
static int want_pointers(struct loader *ld, const yaml_node_t *n, const char *path, char ***out,
                         size_t *count)
{
    static const char what[] = "a JSON pointer such as /requestId (RFC 6901: \"\" or "
                               "/-separated, ~0 for ~ and ~1 for /)";
    char item_path[96], shown[EXCERPT + 8];
    const char *s;
    size_t i;

    if (n->type != YAML_SEQUENCE_NODE || nitems(n) == 0 || nitems(n) > MAX_POINTERS)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected a list of 1 to %d JSON pointers such as "
                    "[/requestId], not %s",
                    path, MAX_POINTERS,
                    n->type == YAML_SEQUENCE_NODE ? (nitems(n) ? "a longer list" : "an empty list")
                                                  : describe(n, shown));
    *out = xcalloc(nitems(n), sizeof **out);
    for (i = 0; i < nitems(n); i++) {
        yaml_node_t *item = item_at(ld, n, i);

        snprintf(item_path, sizeof item_path, "%s[%zu]", path, i);
        if (item == NULL)
            return fail(ld, strict_yaml_line(n), "malformed YAML document");
        /* A pointer may be "": a quoted empty string, which is not YAML's null. */
        if (want_text(ld, item, item_path, what, &s) != 0)
            return -1;
        if (!is_json_pointer(s))
            return fail(ld, strict_yaml_line(item), "%s: expected %s, not %s", item_path, what,
                        describe(item, shown));
        (*out)[i] = xstrdup(s);
        *count = i + 1;
    }
    return 0;
}

/* ---- files ----------------------------------------------------------------------------------- */

/*
 * read_file_capped() (src/util) with the reason put in words in `why`: the key files are read with
 * READ_FILE_REGULAR, since a FIFO or a device could block the start or never end.
 */
static int read_or_say_why(const char *path, size_t cap, unsigned flags, char **out,
                           size_t *out_len, char *why, size_t whylen)
{
    char limit[32];

    if (read_file_capped(path, cap, flags, out, out_len) == 0)
        return 0;
    if (errno == EFBIG) {
        fmt_size((int64_t)cap, limit, sizeof limit);
        snprintf(why, whylen, "larger than %s", limit);
    } else if (errno == EINVAL && (flags & READ_FILE_REGULAR) != 0) {
        snprintf(why, whylen, "not a regular file");
    } else {
        snprintf(why, whylen, "%s", strerror(errno));
    }
    return -1;
}

/* `path` as written, or, when relative, relative to the config file's directory (new). */
static char *beside_config(const char *config, const char *path)
{
    const char *slash = strrchr(config, '/');
    size_t dirlen, plen = strlen(path);
    char *joined;

    if (path[0] == '/' || slash == NULL)
        return xstrdup(path);
    dirlen = (size_t)(slash - config) + 1; /* with the '/' */
    joined = xmalloc(dirlen + plen + 1);
    memcpy(joined, config, dirlen);
    memcpy(joined + dirlen, path, plen + 1);
    return joined;
}

/* ---- upstream and listeners ------------------------------------------------------------------ */

static int load_listen(struct loader *ld, const yaml_node_t *n, const char *path,
                       const char *fallback, char **out)
{
    char host[256], why[256];
    const char *s = fallback;
    uint16_t port;

    if (n != NULL) {
        if (want_text(ld, n, path, "an address such as 127.0.0.1:8180", &s) != 0)
            return -1;
        if (http_listen_split(s, host, sizeof host, &port, why, sizeof why) != 0)
            return fail(ld, strict_yaml_line(n), "%s: %s", path, why);
    }
    *out = xstrdup(s);
    return 0;
}

/*
 * The file a key such as `path` names (relative to the config's directory) whole, for a secret:
 * 0 with *text (NUL-terminated, *len bytes; secret_free() it) and *file (its path; free() it),
 * or -1 having said why.
 */
static int read_secret_file(struct loader *ld, const yaml_node_t *n, const char *path, char **file,
                            char **text, size_t *len)
{
    char why[128], shown[EXCERPT + 4];
    const char *written;

    *file = NULL;
    *text = NULL;
    *len = 0;
    if (want_text(ld, n, path, "a file name", &written) != 0)
        return -1;
    *file = beside_config(ld->name, written);
    if (read_or_say_why(*file, KEY_FILE_MAX_BYTES, READ_FILE_REGULAR, text, len, why, sizeof why) !=
        0)
        return fail(ld, strict_yaml_line(n), "%s: cannot read %s: %s", path, excerpt(*file, shown),
                    why);
    return 0;
}

/* Wipes and frees a secret read_secret_file() gave (`len`: all it read). */
static void secret_free(char *text, size_t len)
{
    if (text != NULL) {
        explicit_bzero(text, len);
        free(text);
    }
}

/*
 * `admin_token_file`: the admin API's bearer token, the file's first line less trailing white
 * space, at least ADMIN_TOKEN_MIN bytes of visible ASCII (a relative path is beside the config).
 */
static int load_admin_token(struct loader *ld, const yaml_node_t *n, struct gw_config *cfg)
{
    char shown[EXCERPT + 4];
    char *file = NULL, *text = NULL;
    size_t read = 0, len, i;
    int rc = -1;

    if (read_secret_file(ld, n, "admin_token_file", &file, &text, &read) != 0)
        goto out;
    len = strcspn(text, "\r\n");
    while (len > 0 && (text[len - 1] == ' ' || text[len - 1] == '\t'))
        len--;
    text[len] = '\0';
    for (i = 0; i < len && text[i] > 0x20 && text[i] < 0x7f; i++)
        ;
    if (len < ADMIN_TOKEN_MIN || i != len) {
        fail(ld, strict_yaml_line(n),
             "admin_token_file: %s must hold a token of at least %d visible ASCII characters "
             "on its first line (e.g. openssl rand -hex 32)",
             excerpt(file, shown), ADMIN_TOKEN_MIN);
        goto out;
    }
    cfg->admin_token = xstrdup(text);
    rc = 0;
out:
    secret_free(text, read);
    free(file);
    return rc;
}

static int load_store(struct loader *ld, const yaml_node_t *n, struct gw_config *cfg)
{
    static const char what[] = "sqlite:PATH, a postgresql:// URI or a libpq key=value string";
    char shown[EXCERPT + 8];
    const char *s = DEFAULT_STORE;

    if (n != NULL) {
        if (want_text(ld, n, "store", what, &s) != 0)
            return -1;
        /* The store opens the rest: only the kind is told apart here. */
        if (strncmp(s, "sqlite:", 7) != 0 && strncmp(s, "postgres://", 11) != 0 &&
            strncmp(s, "postgresql://", 13) != 0 && strchr(s, '=') == NULL)
            return fail(ld, strict_yaml_line(n), "store: expected %s, not %s", what,
                        describe(n, shown));
    }
    if (strncmp(s, "sqlite:", 7) == 0) {
        /* "sqlite:PATH", "sqlite://PATH" or "sqlite:///ABS": a relative PATH is beside the config,
         * so serve, check-config and keys open one file whichever directory they run in. */
        const char *path = s + 7;
        if (strncmp(path, "//", 2) == 0)
            path += 2;
        if (*path == '\0')
            return fail(ld, strict_yaml_line(n), "store: sqlite: names no file");
        cfg->store_file = beside_config(ld->name, path);
        cfg->store = xmalloc(strlen(cfg->store_file) + 8);
        memcpy(cfg->store, "sqlite:", 7);
        memcpy(cfg->store + 7, cfg->store_file, strlen(cfg->store_file) + 1);
        return 0;
    }
    cfg->store = xstrdup(s);
    return 0;
}

/* "http://HOST:PORT" or "http://[V6]:PORT", an optional trailing '/', nothing else. */
static int load_upstream_url(struct loader *ld, const yaml_node_t *n, struct gw_config *cfg)
{
    static const char what[] = "http://HOST:PORT or http://[V6]:PORT";
    char hostport[300], host[256], why[256], shown[EXCERPT + 8];
    const char *url, *authority, *rest;
    size_t alen;
    uint16_t port = 0;

    if (want_text(ld, n, "upstream.url", what, &url) != 0)
        return -1;
    if (ascii_ncaseeq(url, "https://", 8))
        return fail(ld, strict_yaml_line(n),
                    "upstream.url: https upstreams are not supported; put the "
                    "gateway next to the service");
    if (!ascii_ncaseeq(url, "http://", 7))
        return fail(ld, strict_yaml_line(n), "upstream.url: expected %s, not %s", what,
                    describe(n, shown));
    authority = url + 7;
    alen = strcspn(authority, "/?#");
    rest = authority + alen;
    if (memchr(authority, '@', alen) != NULL)
        return fail(ld, strict_yaml_line(n),
                    "upstream.url: no user information (user@) is allowed; "
                    "expected %s",
                    what);
    if (rest[0] != '\0' && strcmp(rest, "/") != 0)
        return fail(ld, strict_yaml_line(n),
                    "upstream.url: expected %s without a path, query or "
                    "fragment (requests keep their own path), not %s",
                    what, describe(n, shown));
    if (alen >= sizeof hostport)
        return fail(ld, strict_yaml_line(n), "upstream.url: the host is too long");
    memcpy(hostport, authority, alen);
    hostport[alen] = '\0';
    if (http_listen_split(hostport, host, sizeof host, &port, why, sizeof why) != 0 || port == 0)
        return fail(ld, strict_yaml_line(n),
                    "upstream.url: expected %s with a port from 1 to 65535, not %s", what,
                    describe(n, shown));
    /* Nothing is resolved here, but a host no resolver accepts is a typo worth saying now. */
    if (hostport[0] == '['
            ? strspn(host, "0123456789abcdefABCDEF:.") != strlen(host) || strchr(host, ':') == NULL
            : strspn(host, "0123456789abcdefghijklmnopqrstuvwxyz"
                           "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-_") != strlen(host))
        return fail(ld, strict_yaml_line(n),
                    "upstream.url: \"%s\" is not a host name or an IP address",
                    excerpt(host, shown));
    cfg->upstream_url = xstrndup(url, 7 + alen); /* without the trailing '/' */
    cfg->upstream_host = xstrdup(host);
    cfg->upstream_port = port;
    return 0;
}

static int load_upstream(struct loader *ld, const yaml_node_t *map, struct gw_config *cfg)
{
    static const char *const keys[] = {"url",
                                       "connect_timeout",
                                       "timeout",
                                       "max_connections",
                                       "max_response_size",
                                       "keyed_connections"};
    enum { URL, CONNECT_TIMEOUT, TIMEOUT, MAX_CONNECTIONS, MAX_RESPONSE_SIZE, KEYED_CONNECTIONS };
    yaml_node_t *v[COUNT(keys)];
    char shown[EXCERPT + 8];
    const char *s;
    int64_t x;

    cfg->upstream_connect_timeout_ms = (int)DEFAULT_CONNECT_TIMEOUT_MS;
    cfg->upstream_timeout_ms = (int)DEFAULT_TIMEOUT_MS;
    cfg->upstream_max_connections = DEFAULT_UPSTREAM_CONNECTIONS;
    cfg->max_response_bytes = (size_t)DEFAULT_MAX_RESPONSE;
    /*
     * A connection an upstream sent a stray answer on can look idle at any check before reuse
     * (the answer may come later), so keyed requests, whose answers are stored, get their own.
     */
    cfg->upstream_keyed_fresh = 1;
    if (collect(ld, map, "upstream", keys, COUNT(keys), v) != 0)
        return -1;
    if (v[URL] == NULL)
        return missing(ld, map, "upstream", "url", "url: http://HOST:PORT");
    if (load_upstream_url(ld, v[URL], cfg) != 0)
        return -1;
    if (v[CONNECT_TIMEOUT] != NULL) {
        if (want_duration(ld, v[CONNECT_TIMEOUT], "upstream.connect_timeout", 1, HOUR_MS, &x) != 0)
            return -1;
        cfg->upstream_connect_timeout_ms = (int)x;
    }
    if (v[TIMEOUT] != NULL) {
        if (want_duration(ld, v[TIMEOUT], "upstream.timeout", 1, DAY_MS, &x) != 0)
            return -1;
        cfg->upstream_timeout_ms = (int)x;
    }
    if (v[MAX_CONNECTIONS] != NULL) {
        if (want_int(ld, v[MAX_CONNECTIONS], "upstream.max_connections", 1, 10000, &x) != 0)
            return -1;
        cfg->upstream_max_connections = (int)x;
    }
    if (v[MAX_RESPONSE_SIZE] != NULL) {
        if (want_size(ld, v[MAX_RESPONSE_SIZE], "upstream.max_response_size", 1, GIB, &x) != 0)
            return -1;
        cfg->max_response_bytes = (size_t)x;
    }
    if (v[KEYED_CONNECTIONS] != NULL) {
        if (want_text(ld, v[KEYED_CONNECTIONS], "upstream.keyed_connections", "pooled or fresh",
                      &s) != 0)
            return -1;
        if (strcmp(s, "fresh") != 0 && strcmp(s, "pooled") != 0)
            return fail(ld, strict_yaml_line(v[KEYED_CONNECTIONS]),
                        "upstream.keyed_connections: expected pooled or fresh, not %s",
                        describe(v[KEYED_CONNECTIONS], shown));
        cfg->upstream_keyed_fresh = strcmp(s, "fresh") == 0;
    }
    return 0;
}

/* ---- principal ------------------------------------------------------------------------------- */

static int load_jwt_key(struct loader *ld, const yaml_node_t *n, const char *path, int hs256,
                        struct gw_config *cfg)
{
    char shown[EXCERPT + 4];
    char *file = NULL, *key = NULL;
    size_t read = 0, len;
    int rc = -1;

    if (read_secret_file(ld, n, path, &file, &key, &read) != 0)
        goto out;
    len = read;
    if (hs256) {
        /* The bytes are the secret; `echo secret > file` adds a newline that is not part of it. */
        if (len > 0 && key[len - 1] == '\n')
            len--;
        if (len > 0 && key[len - 1] == '\r')
            len--;
        key[len] = '\0';
        if (len < 32) {
            fail(ld, strict_yaml_line(n),
                 "%s: %s holds %zu bytes; an HS256 secret needs at least 32 "
                 "(e.g. openssl rand -base64 48)",
                 path, excerpt(file, shown), len);
            goto out;
        }
    } else {
        if (strlen(key) != len || strstr(key, "-----BEGIN PUBLIC KEY-----") == NULL) {
            fail(ld, strict_yaml_line(n),
                 "%s: %s is not a PEM public key (-----BEGIN PUBLIC KEY-----)", path,
                 excerpt(file, shown));
            goto out;
        }
    }
    cfg->jwt_key = key;
    cfg->jwt_key_len = len;
    key = NULL;
    rc = 0;
out:
    secret_free(key, read);
    free(file);
    return rc;
}

static int load_jwt(struct loader *ld, const yaml_node_t *map, struct gw_config *cfg)
{
    static const char *const keys[] = {"alg",    "secret_file", "public_key_file",
                                       "issuer", "audience",    "require_exp"};
    enum { ALG, SECRET_FILE, PUBLIC_KEY_FILE, ISSUER, AUDIENCE, REQUIRE_EXP };
    yaml_node_t *v[COUNT(keys)];
    char shown[EXCERPT + 8];
    const char *s;
    int hs256;

    if (collect(ld, map, "principal.jwt", keys, COUNT(keys), v) != 0)
        return -1;
    if (v[ALG] == NULL)
        return missing(ld, map, "principal.jwt", "alg", "HS256 or RS256");
    if (want_text(ld, v[ALG], "principal.jwt.alg", "HS256 or RS256", &s) != 0)
        return -1;
    if (strcmp(s, "HS256") != 0 && strcmp(s, "RS256") != 0)
        return fail(ld, strict_yaml_line(v[ALG]),
                    "principal.jwt.alg: expected HS256 or RS256, not %s", describe(v[ALG], shown));
    hs256 = strcmp(s, "HS256") == 0;
    cfg->jwt_alg = hs256 ? GW_JWT_HS256 : GW_JWT_RS256;
    if (hs256 && v[PUBLIC_KEY_FILE] != NULL)
        return fail(ld, strict_yaml_line(v[PUBLIC_KEY_FILE]),
                    "principal.jwt.public_key_file: only for "
                    "alg RS256; HS256 takes secret_file");
    if (!hs256 && v[SECRET_FILE] != NULL)
        return fail(ld, strict_yaml_line(v[SECRET_FILE]),
                    "principal.jwt.secret_file: only for alg HS256; "
                    "RS256 takes public_key_file");
    if (hs256 && v[SECRET_FILE] == NULL)
        return missing(ld, map, "principal.jwt", "secret_file", "alg HS256 needs the secret");
    if (!hs256 && v[PUBLIC_KEY_FILE] == NULL)
        return missing(ld, map, "principal.jwt", "public_key_file",
                       "alg RS256 needs the PEM public key");
    if (hs256 && load_jwt_key(ld, v[SECRET_FILE], "principal.jwt.secret_file", 1, cfg) != 0)
        return -1;
    if (!hs256 &&
        load_jwt_key(ld, v[PUBLIC_KEY_FILE], "principal.jwt.public_key_file", 0, cfg) != 0)
        return -1;
    if (v[ISSUER] != NULL) {
        if (want_text(ld, v[ISSUER], "principal.jwt.issuer", "the issuer (iss) expected", &s) != 0)
            return -1;
        cfg->jwt_issuer = xstrdup(s);
    }
    if (v[AUDIENCE] != NULL) {
        if (want_text(ld, v[AUDIENCE], "principal.jwt.audience", "the audience (aud) expected",
                      &s) != 0)
            return -1;
        cfg->jwt_audience = xstrdup(s);
    }
    cfg->jwt_require_exp = 1;
    if (v[REQUIRE_EXP] != NULL &&
        want_bool(ld, v[REQUIRE_EXP], "principal.jwt.require_exp", &cfg->jwt_require_exp) != 0)
        return -1;
    return 0;
}

static int load_principal(struct loader *ld, const yaml_node_t *n, struct gw_config *cfg)
{
    static const char *const keys[] = {"header", "authorization", "jwt"};
    enum { HEADER, AUTHORIZATION, JWT };
    yaml_node_t *v[COUNT(keys)];
    char shown[EXCERPT + 8];
    const char *s;
    size_t i, given = 0;
    int last_line = 0;

    /* config.h's shorthand: `principal: authorization`. */
    if (n->type == YAML_SCALAR_NODE && strcmp(strict_yaml_text(n), "authorization") == 0) {
        cfg->principal = GW_PRINCIPAL_AUTHORIZATION;
        return 0;
    }
    if (n->type != YAML_MAPPING_NODE)
        return fail(ld, strict_yaml_line(n),
                    "principal: expected a mapping with one of header, "
                    "authorization or jwt, not %s",
                    describe(n, shown));
    if (collect(ld, n, "principal", keys, COUNT(keys), v) != 0)
        return -1;
    /* Two given: point at the later one. */
    for (i = 0; i < COUNT(keys); i++) {
        if (v[i] != NULL) {
            given++;
            if (strict_yaml_line(v[i]) > last_line)
                last_line = strict_yaml_line(v[i]);
        }
    }
    if (given == 0)
        return fail(ld, strict_yaml_line(n),
                    "principal: expected one of header, authorization or jwt");
    if (given > 1)
        return fail(ld, last_line, "principal: give only one of header, authorization and jwt");
    if (v[HEADER] != NULL) {
        if (want_header_name(ld, v[HEADER], "principal.header", &s) != 0)
            return -1;
        /* A raw credential must not become a scope, stored in clear in every record. */
        if (ascii_caseeq(s, "Authorization"))
            return fail(ld, strict_yaml_line(v[HEADER]),
                        "principal.header: Authorization holds a "
                        "credential; use principal.authorization: sha256, "
                        "which keys on its SHA-256");
        cfg->principal = GW_PRINCIPAL_HEADER;
        cfg->principal_header = xstrdup(s);
    } else if (v[AUTHORIZATION] != NULL) {
        if (want_text(ld, v[AUTHORIZATION], "principal.authorization", "sha256", &s) != 0)
            return -1;
        if (strcmp(s, "sha256") != 0)
            return fail(ld, strict_yaml_line(v[AUTHORIZATION]),
                        "principal.authorization: expected sha256 "
                        "(the only digest offered), not %s",
                        describe(v[AUTHORIZATION], shown));
        cfg->principal = GW_PRINCIPAL_AUTHORIZATION;
    } else {
        cfg->principal = GW_PRINCIPAL_JWT;
        if (load_jwt(ld, v[JWT], cfg) != 0)
            return -1;
    }
    return 0;
}

/* ---- limits ---------------------------------------------------------------------------------- */

#define LIMIT_FLAG_NAME(name, field, min, max) name,
static const char *const limit_flags[] = {HTTP_LIMITS_FLAGS(LIMIT_FLAG_NAME)};
#undef LIMIT_FLAG_NAME

/* `limits:` takes the serve flags' names with '_' for '-'; http_limits_flag() checks the values. */
static int load_limits(struct loader *ld, const yaml_node_t *map, struct gw_config *cfg)
{
    char names[COUNT(limit_flags)][40];
    const char *keys[COUNT(limit_flags)];
    yaml_node_t *v[COUNT(limit_flags)];
    char path[64], why[256];
    const char *s, *sentence;
    size_t i, j, flag_len;

    for (i = 0; i < COUNT(limit_flags); i++) {
        snprintf(names[i], sizeof names[i], "%s", limit_flags[i]);
        for (j = 0; names[i][j] != '\0'; j++) {
            if (names[i][j] == '-')
                names[i][j] = '_';
        }
        keys[i] = names[i];
    }
    if (collect(ld, map, "limits", keys, COUNT(keys), v) != 0)
        return -1;
    for (i = 0; i < COUNT(limit_flags); i++) {
        if (v[i] == NULL)
            continue;
        snprintf(path, sizeof path, "limits.%s", keys[i]);
        if (want_text(ld, v[i], path, "an integer", &s) != 0)
            return -1;
        why[0] = '\0';
        if (http_limits_flag(&cfg->limits, limit_flags[i], s, why, sizeof why) != 1) {
            /* Its sentence names the flag ("--max-connections must be..."): name the key. */
            sentence = why;
            flag_len = strlen(limit_flags[i]);
            if (strncmp(why, "--", 2) == 0 && strncmp(why + 2, limit_flags[i], flag_len) == 0 &&
                why[2 + flag_len] == ' ')
                sentence = why + 3 + flag_len;
            return fail(ld, strict_yaml_line(v[i]), "%s: %s", path, sentence);
        }
    }
    return 0;
}

/*
 * `principal_limits:` what one caller may make the gateway keep; 0 turns a limit off.  The
 * defaults are far above what a client that retries (rather than floods) needs.
 */
static int load_principal_limits(struct loader *ld, const yaml_node_t *map, struct gw_config *cfg)
{
    static const char *const keys[] = {"keys_in_flight", "new_keys_per_second", "stored_bytes",
                                       "tracked"};
    enum { KEYS_IN_FLIGHT, NEW_KEYS_PER_SECOND, STORED_BYTES, TRACKED };
    yaml_node_t *v[COUNT(keys)];
    int64_t x;

    if (collect(ld, map, "principal_limits", keys, COUNT(keys), v) != 0)
        return -1;
    if (v[KEYS_IN_FLIGHT] != NULL) {
        if (want_int(ld, v[KEYS_IN_FLIGHT], "principal_limits.keys_in_flight", 0, 1000000, &x) != 0)
            return -1;
        cfg->limit_keys_in_flight = (int)x;
    }
    if (v[NEW_KEYS_PER_SECOND] != NULL) {
        if (want_int(ld, v[NEW_KEYS_PER_SECOND], "principal_limits.new_keys_per_second", 0, 1000000,
                     &x) != 0)
            return -1;
        cfg->limit_new_keys_per_second = (int)x;
    }
    if (v[STORED_BYTES] != NULL) {
        if (want_size(ld, v[STORED_BYTES], "principal_limits.stored_bytes", 0, 1024 * 1024 * GIB,
                      &x) != 0)
            return -1;
        cfg->limit_stored_bytes = (uint64_t)x;
    }
    if (v[TRACKED] != NULL) {
        if (want_int(ld, v[TRACKED], "principal_limits.tracked", 1, 10000000, &x) != 0)
            return -1;
        cfg->limit_tracked = (int)x;
    }
    return 0;
}

/* ---- routes ---------------------------------------------------------------------------------- */

static int is_param_name(const char *s, size_t n)
{
    size_t i;

    if (n == 0 || !((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
        return 0;
    for (i = 1; i < n; i++) {
        if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    }
    return 1;
}

/* RFC 3986 pchar, one byte of a literal path segment ('%' is checked with its digits). */
static int is_pchar(char c)
{
    return c != '\0' && strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                               "-._~!$&'()*+,;=:@%",
                               c) != NULL;
}

/* 1 when the template `path` has the parameter {name} (name of `n` bytes). */
static int has_param(const char *path, const char *name, size_t n)
{
    const char *seg = path;
    size_t len;

    while (*seg == '/') {
        seg++;
        len = strcspn(seg, "/");
        if (len == n + 2 && seg[0] == '{' && memcmp(seg + 1, name, n) == 0)
            return 1;
        seg += len;
    }
    return 0;
}

/*
 * Checks the path template of a route's match and appends its shape to `shape`: the path with
 * every parameter blanked to "{}".  Two routes of one method are the same route exactly when their
 * shapes are equal, since a literal segment cannot hold braces.
 */
static int check_template(struct loader *ld, const yaml_node_t *n, const char *where,
                          const char *path, char *shape)
{
    const char *seg = path, *p, *prev;
    char *w = shape + strlen(shape);
    size_t len, prev_len;

    if (path[0] != '/')
        return fail(ld, strict_yaml_line(n), "%s: the path must start with '/'", where);
    while (*seg == '/') {
        seg++;
        *w++ = '/';
        len = strcspn(seg, "/");
        /* Requests are matched with "//", a trailing '/' and dot segments resolved (route.c). */
        if ((len == 0 && strcmp(path, "/") != 0) || (len == 1 && seg[0] == '.') ||
            (len == 2 && seg[0] == '.' && seg[1] == '.'))
            return fail(ld, strict_yaml_line(n),
                        "%s: \"%.*s\" has an empty, \".\" or \"..\" segment; request paths are "
                        "matched with those resolved, so write the path without them",
                        where, EXCERPT, path);
        if (memchr(seg, '{', len) != NULL || memchr(seg, '}', len) != NULL) {
            if (len < 3 || seg[0] != '{' || seg[len - 1] != '}' || !is_param_name(seg + 1, len - 2))
                return fail(ld, strict_yaml_line(n),
                            "%s: a path parameter is a whole segment {name} with "
                            "name [A-Za-z_][A-Za-z0-9_]*, not \"%.*s\"",
                            where, (int)(len > EXCERPT ? EXCERPT : len), seg);
            /* The segments before this one, each after its '/'. */
            for (prev = path; prev < seg - 1; prev += 1 + prev_len) {
                prev_len = strcspn(prev + 1, "/");
                if (prev_len == len && memcmp(prev + 1, seg, len) == 0)
                    return fail(ld, strict_yaml_line(n), "%s: the parameter %.*s appears twice",
                                where, (int)len, seg);
            }
            memcpy(w, "{}", 2);
            w += 2;
        } else {
            for (p = seg; p < seg + len; p++) {
                if (*p == '?')
                    return fail(ld, strict_yaml_line(n),
                                "%s: no query string ('?') in a route's path", where);
                if (!is_pchar(*p) || (*p == '%' && (hex_value(p[1]) < 0 || hex_value(p[2]) < 0)))
                    return fail(ld, strict_yaml_line(n),
                                "%s: byte 0x%02x is not allowed in a path "
                                "(RFC 3986: letters, digits, -._~!$&'()*+,;=:@ "
                                "and %%XX)",
                                where, (unsigned)(unsigned char)*p);
            }
            /* Paths are compared ignoring case unless a route says otherwise: two routes
             * differing only in case would be one route. */
            for (p = seg; p < seg + len; p++)
                *w++ = ascii_lower(*p);
        }
        seg += len;
    }
    *w = '\0';
    return 0;
}

/* "METHOD /path/template": an upper-case method, one space, a path; unique among the routes. */
static int load_match(struct loader *ld, const yaml_node_t *n, const char *path,
                      struct gw_config *cfg, size_t index)
{
    static const char what[] = "\"METHOD /path\" such as \"POST /v1/orders/{id}/refunds\"";
    struct gw_route *r = &cfg->routes[index];
    char shape[MAX_MATCH_LEN + 8], shown[EXCERPT + 8];
    const char *s, *sp;
    size_t mlen, i;

    if (want_text(ld, n, path, what, &s) != 0)
        return -1;
    if (strlen(s) > MAX_MATCH_LEN)
        return fail(ld, strict_yaml_line(n), "%s: longer than %d bytes", path, MAX_MATCH_LEN);
    sp = strchr(s, ' ');
    mlen = sp != NULL ? (size_t)(sp - s) : 0;
    if (sp == NULL || mlen == 0 || strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != mlen)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected %s (an upper-case method, a space, the path), "
                    "not %s",
                    path, what, describe(n, shown));
    r->method = xstrndup(s, mlen);
    r->path = xstrdup(sp + 1);
    memcpy(shape, s, mlen + 1); /* "POST " */
    shape[mlen + 1] = '\0';
    if (check_template(ld, n, path, r->path, shape) != 0)
        return -1;
    for (i = 0; i < index; i++) {
        if (strcmp(ld->seen[i].shape, shape) == 0)
            return fail(ld, strict_yaml_line(n),
                        "%s: \"%s\" is the same route as routes[%zu] at line %d "
                        "(parameters match any segment, and paths match ignoring case)",
                        path, excerpt(s, shown), i, ld->seen[i].match_line);
    }
    ld->seen[index].shape = xstrdup(shape);
    ld->seen[index].match_line = strict_yaml_line(n);
    return 0;
}

static int load_operation(struct loader *ld, const yaml_node_t *n, const char *path,
                          struct gw_config *cfg, size_t index)
{
    static const char what[] = "an operation name such as payments.create ([A-Za-z0-9._-], at "
                               "most 64)";
    char shown[EXCERPT + 8];
    const char *s;
    size_t i, len;

    if (want_text(ld, n, path, what, &s) != 0)
        return -1;
    len = strlen(s);
    if (len == 0 || len > MAX_OPERATION_LEN ||
        strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != len)
        return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, what,
                    describe(n, shown));
    /* The operation is the scope's middle part: two routes sharing it would share records. */
    for (i = 0; i < index; i++) {
        if (strcmp(cfg->routes[i].operation, s) == 0)
            return fail(ld, strict_yaml_line(n),
                        "%s: \"%s\" is already the operation of routes[%zu] at "
                        "line %d; each route needs its own",
                        path, s, i, ld->seen[i].operation_line);
    }
    cfg->routes[index].operation = xstrdup(s);
    ld->seen[index].operation_line = strict_yaml_line(n);
    return 0;
}

static int load_key(struct loader *ld, const yaml_node_t *map, const char *path, struct gw_route *r)
{
    static const char *const keys[] = {"required", "header", "body", "forward"};
    enum { REQUIRED, HEADER, BODY, FORWARD };
    yaml_node_t *v[COUNT(keys)];
    char sub[96], shown[EXCERPT + 8];
    const char *s;

    if (collect(ld, map, path, keys, COUNT(keys), v) != 0)
        return -1;
    r->key_forward_token = v[BODY] == NULL;
    if (v[FORWARD] != NULL) {
        snprintf(sub, sizeof sub, "%s.forward", path);
        if (want_text(ld, v[FORWARD], sub, "token or sf-string", &s) != 0)
            return -1;
        if (strcmp(s, "token") != 0 && strcmp(s, "sf-string") != 0)
            return fail(ld, strict_yaml_line(v[FORWARD]), "%s: expected token or sf-string, not %s",
                        sub, describe(v[FORWARD], shown));
        r->key_forward_token = strcmp(s, "token") == 0;
    }
    if (v[REQUIRED] != NULL) {
        snprintf(sub, sizeof sub, "%s.required", path);
        if (want_bool(ld, v[REQUIRED], sub, &r->key_required) != 0)
            return -1;
    }
    if (v[HEADER] != NULL && v[BODY] != NULL)
        return fail(
            ld,
            strict_yaml_line(v[BODY]) > strict_yaml_line(v[HEADER]) ? strict_yaml_line(v[BODY])
                                                                    : strict_yaml_line(v[HEADER]),
            "%s: header and body are mutually exclusive; the key comes from one place", path);
    if (v[BODY] != NULL) {
        snprintf(sub, sizeof sub, "%s.body", path);
        r->key_source = GW_KEY_BODY;
        return want_pointers(ld, v[BODY], sub, &r->key_pointers, &r->nkey_pointers);
    }
    if (v[HEADER] != NULL) {
        snprintf(sub, sizeof sub, "%s.header", path);
        if (want_header_name(ld, v[HEADER], sub, &s) != 0)
            return -1;
        r->key_header = xstrdup(s);
    }
    return 0;
}

static int load_fingerprint(struct loader *ld, const yaml_node_t *n, const char *path,
                            struct gw_route *r)
{
    char shown[EXCERPT + 8];

    if (n->type == YAML_SEQUENCE_NODE) {
        r->fp_body = GW_FP_BODY_POINTERS;
        return want_pointers(ld, n, path, &r->fp_pointers, &r->nfp_pointers);
    }
    if (n->type == YAML_SCALAR_NODE && strcmp(strict_yaml_text(n), "body") == 0) {
        r->fp_body = GW_FP_BODY_ALL;
        return 0;
    }
    if (n->type == YAML_SCALAR_NODE && strcmp(strict_yaml_text(n), "none") == 0) {
        r->fp_body = GW_FP_BODY_NONE;
        return 0;
    }
    return fail(ld, strict_yaml_line(n),
                "%s: expected body, none or a list of JSON pointers such as "
                "[/amount, /currency], not %s",
                path, describe(n, shown));
}

static void default_statuses(struct gw_route *r)
{
    size_t i;
    int s;

    memset(r->store_status, 0, sizeof r->store_status);
    for (s = 200; s < 300; s++)
        r->store_status[s] = 1;
    for (s = 400; s < 500; s++)
        r->store_status[s] = 1;
    for (i = 0; i < COUNT(default_unstored); i++)
        r->store_status[default_unstored[i]] = 0;
}

/* A list of classes ("2xx") and statuses (404): exactly the statuses stored; never a 5xx. */
static int load_statuses(struct loader *ld, const yaml_node_t *n, const char *path,
                         struct gw_route *r)
{
    static const char what[] = "a status class such as 2xx or a status from 100 to 499";
    char item_path[96], shown[EXCERPT + 8];
    const char *s;
    int64_t status;
    size_t i;
    int cls, k;

    if (n->type != YAML_SEQUENCE_NODE || nitems(n) == 0)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected a non-empty list of statuses such as [2xx, "
                    "404], not %s",
                    path, n->type == YAML_SEQUENCE_NODE ? "an empty list" : describe(n, shown));
    memset(r->store_status, 0, sizeof r->store_status);
    for (i = 0; i < nitems(n); i++) {
        yaml_node_t *item = item_at(ld, n, i);

        snprintf(item_path, sizeof item_path, "%s[%zu]", path, i);
        if (item == NULL)
            return fail(ld, strict_yaml_line(n), "malformed YAML document");
        if (want_text(ld, item, item_path, what, &s) != 0)
            return -1;
        if (strlen(s) == 3 && s[0] >= '1' && s[0] <= '9' && (s[1] == 'x' || s[1] == 'X') &&
            s[2] == s[1]) {
            cls = s[0] - '0';
            if (cls == 5)
                goto no_5xx;
            if (cls > 5)
                return fail(ld, strict_yaml_line(item), "%s: expected %s, not %s", item_path, what,
                            describe(item, shown));
            for (k = cls * 100; k < cls * 100 + 100; k++)
                r->store_status[k] = 1;
            continue;
        }
        if (parse_int64(s, 100, GW_STATUS_LIMIT - 1, &status) != 0)
            return fail(ld, strict_yaml_line(item), "%s: expected %s, not %s", item_path, what,
                        describe(item, shown));
        if (status >= 500)
            goto no_5xx;
        r->store_status[status] = 1;
        continue;
    no_5xx:
        return fail(ld, strict_yaml_line(item),
                    "%s: 5xx answers are never stored: a retry must be able "
                    "to run again",
                    item_path);
    }
    return 0;
}

/* Response headers a replay repeats: names only, none that belongs to one connection. */
/*
 * A list of at most MAX_STORE_HEADERS header names, none twice, into *names (new strings), *count
 * of them; `example` shows one in the message of a value that is no such list.  `refused`, when
 * not NULL, says why a name may not be listed (NULL: it may).
 */
static int load_header_names(struct loader *ld, const yaml_node_t *n, const char *path,
                             const char *example,
                             const char *(*refused)(const char *name, char *buf, size_t len),
                             char ***names, size_t *count)
{
    char item_path[96], shown[EXCERPT + 8], buf[200];
    const char *s, *why;

    if (n->type != YAML_SEQUENCE_NODE || nitems(n) > MAX_STORE_HEADERS)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected a list of at most %d header names such as %s, not %s", path,
                    MAX_STORE_HEADERS, example,
                    n->type == YAML_SEQUENCE_NODE ? "a longer list" : describe(n, shown));
    *names = xcalloc(nitems(n) + 1, sizeof **names);
    for (size_t i = 0; i < nitems(n); i++) {
        yaml_node_t *item = item_at(ld, n, i);

        snprintf(item_path, sizeof item_path, "%s[%zu]", path, i);
        if (item == NULL)
            return fail(ld, strict_yaml_line(n), "malformed YAML document");
        if (want_header_name(ld, item, item_path, &s) != 0)
            return -1;
        if (refused && (why = refused(s, buf, sizeof buf)) != NULL)
            return fail(ld, strict_yaml_line(item), "%s: %s", item_path, why);
        for (size_t j = 0; j < i; j++) {
            if (ascii_caseeq(s, (*names)[j]))
                return fail(ld, strict_yaml_line(item), "%s: %s is listed twice", item_path, s);
        }
        (*names)[(*count)++] = xstrdup(s);
    }
    return 0;
}

/* Why a response header may not be stored and replayed (in `buf` if need be), or NULL. */
static const char *not_storable(const char *name, char *buf, size_t len)
{
    if (ascii_caseeq(name, "Set-Cookie"))
        return "Set-Cookie is never stored: a replayed answer must not hand out a session "
               "cookie again";
    if (ascii_caseeq(name, "Content-Length"))
        return "Content-Length is not stored: a replay sends the length of the stored body";
    if ((name = http_hop_by_hop(name)) == NULL)
        return NULL;
    snprintf(buf, len,
             "%s is a hop-by-hop header: it describes one connection, not the answer, so it is "
             "not replayed",
             name);
    return buf;
}

static int load_store_headers(struct loader *ld, const yaml_node_t *n, const char *path,
                              struct gw_route *r)
{
    return load_header_names(ld, n, path, "[Content-Type, Location]", not_storable,
                             &r->store_headers, &r->nstore_headers);
}

/* Why a request header cannot be part of the scope, or NULL. */
static const char *not_scopable(const char *name, char *buf, size_t len)
{
    static const char *const taken[] = {"Content-Length",  "Expect",       "Authorization",
                                        "Idempotency-Key", "Content-Type", "X-Forwarded-For"};
    const char *hop = http_hop_by_hop(name);

    if ((name = hop ? hop : ascii_caseeq_any(name, taken, COUNT(taken))) == NULL)
        return NULL;
    snprintf(buf, len,
             "%s cannot be a scope header: it says how the request travels or what it is (the "
             "key, the caller, the body), not on whose behalf it acts",
             name);
    return buf;
}

/*
 * "GET /path?query" with placeholders {key} and the route's own {params} only: the gateway fills
 * them in, and any other name in braces would be sent as written.
 */
static int load_reconcile(struct loader *ld, const yaml_node_t *n, const char *path,
                          struct gw_route *r)
{
    static const char what[] = "\"GET /path\" such as \"GET /v1/orders?requestId={key}\"";
    char shown[EXCERPT + 8];
    const char *s, *p, *close;
    size_t len;

    if (want_text(ld, n, path, what, &s) != 0)
        return -1;
    if (strncmp(s, "GET /", 5) != 0)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected %s (the upstream answers it 2xx when the request "
                    "was done, 404 when not), not %s",
                    path, what, describe(n, shown));
    for (p = s + 4; *p != '\0'; p++) {
        if (*p == '{') {
            close = p + 1 + strcspn(p + 1, "{}");
            if (*close != '}')
                return fail(ld, strict_yaml_line(n), "%s: a '{' without its '}'", path);
            len = (size_t)(close - p - 1);
            if (!(len == 3 && memcmp(p + 1, "key", 3) == 0) &&
                !(is_param_name(p + 1, len) && has_param(r->path, p + 1, len)))
                return fail(ld, strict_yaml_line(n),
                            "%s: {%.*s} is neither {key} nor a parameter of %s", path,
                            (int)(len > EXCERPT ? EXCERPT : len), p + 1, excerpt(r->path, shown));
            p = close;
            continue;
        }
        if (*p == '}')
            return fail(ld, strict_yaml_line(n), "%s: a '}' without its '{'", path);
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f || *p == '#')
            return fail(ld, strict_yaml_line(n),
                        "%s: byte 0x%02x is not allowed; percent-encode it", path,
                        (unsigned)(unsigned char)*p);
    }
    r->unknown = GW_UNKNOWN_RECONCILE;
    r->reconcile_path = xstrdup(s + 4);
    return 0;
}

static int load_on_unknown(struct loader *ld, const yaml_node_t *n, const char *path,
                           struct gw_route *r)
{
    static const char *const keys[] = {"reconcile", "headers"};
    yaml_node_t *v[COUNT(keys)];
    char sub[96], shown[EXCERPT + 8];

    if (n->type == YAML_MAPPING_NODE) {
        if (collect(ld, n, path, keys, COUNT(keys), v) != 0)
            return -1;
        if (v[0] == NULL)
            return missing(ld, n, path, "reconcile", "reconcile: \"GET /path?id={key}\"");
        snprintf(sub, sizeof sub, "%s.headers", path);
        if (v[1] != NULL && load_header_names(ld, v[1], sub, "[X-Tenant]", NULL,
                                              &r->reconcile_headers, &r->nreconcile_headers) != 0)
            return -1;
        snprintf(sub, sizeof sub, "%s.reconcile", path);
        return load_reconcile(ld, v[0], sub, r);
    }
    if (n->type == YAML_SCALAR_NODE && strcmp(strict_yaml_text(n), "hold") == 0) {
        r->unknown = GW_UNKNOWN_HOLD;
        return 0;
    }
    if (n->type == YAML_SCALAR_NODE && strcmp(strict_yaml_text(n), "resend") == 0) {
        r->unknown = GW_UNKNOWN_RESEND;
        return 0;
    }
    return fail(ld, strict_yaml_line(n),
                "%s: expected hold, resend or {reconcile: \"GET /path\"}, not %s", path,
                describe(n, shown));
}

static int load_route(struct loader *ld, const yaml_node_t *map, struct gw_config *cfg,
                      size_t index)
{
    static const char *const keys[] = {"match",
                                       "operation",
                                       "key",
                                       "fingerprint",
                                       "retention",
                                       "lease",
                                       "wait",
                                       "store_statuses",
                                       "store_headers",
                                       "max_stored_body",
                                       "on_unknown",
                                       "case_sensitive",
                                       "scope_headers",
                                       "store_retryable",
                                       "fingerprint_query"};
    enum {
        MATCH,
        OPERATION,
        KEY,
        FINGERPRINT,
        RETENTION,
        LEASE,
        WAIT,
        STORE_STATUSES,
        STORE_HEADERS,
        MAX_STORED_BODY,
        ON_UNKNOWN,
        CASE_SENSITIVE,
        SCOPE_HEADERS,
        STORE_RETRYABLE,
        FINGERPRINT_QUERY
    };
    struct gw_route *r = &cfg->routes[index];
    yaml_node_t *v[COUNT(keys)];
    char where[32], path[64], a[32], b[32];
    int64_t x = 0;
    size_t i;

    snprintf(where, sizeof where, "routes[%zu]", index);
    r->line = strict_yaml_line(map);
    r->key_required = 1;
    r->key_forward_token = 1;
    r->key_source = GW_KEY_HEADER;
    r->fp_body = GW_FP_BODY_ALL;
    r->fp_query = 1;
    r->retention_ms = DEFAULT_RETENTION_MS;
    r->lease_ms = cfg->upstream_timeout_ms + DEFAULT_LEASE_MARGIN_MS;
    r->wait_ms = DEFAULT_WAIT_MS;
    r->max_stored_body = cfg->max_response_bytes < (size_t)DEFAULT_MAX_STORED_BODY
                             ? cfg->max_response_bytes
                             : (size_t)DEFAULT_MAX_STORED_BODY;
    r->unknown = GW_UNKNOWN_HOLD;
    if (collect(ld, map, where, keys, COUNT(keys), v) != 0)
        return -1;

    if (v[MATCH] == NULL)
        return missing(ld, map, where, "match", "match: POST /v1/payments");
    snprintf(path, sizeof path, "%s.match", where);
    if (load_match(ld, v[MATCH], path, cfg, index) != 0)
        return -1;
    if (v[OPERATION] == NULL)
        return missing(ld, map, where, "operation", "operation: payments.create");
    snprintf(path, sizeof path, "%s.operation", where);
    if (load_operation(ld, v[OPERATION], path, cfg, index) != 0)
        return -1;

    snprintf(path, sizeof path, "%s.case_sensitive", where);
    if (v[CASE_SENSITIVE] != NULL &&
        want_bool(ld, v[CASE_SENSITIVE], path, &r->case_sensitive) != 0)
        return -1;

    snprintf(path, sizeof path, "%s.key", where);
    if (v[KEY] != NULL && load_key(ld, v[KEY], path, r) != 0)
        return -1;
    if (r->key_source == GW_KEY_HEADER && r->key_header == NULL)
        r->key_header = xstrdup(DEFAULT_KEY_HEADER);

    snprintf(path, sizeof path, "%s.fingerprint", where);
    if (v[FINGERPRINT] != NULL && load_fingerprint(ld, v[FINGERPRINT], path, r) != 0)
        return -1;

    snprintf(path, sizeof path, "%s.retention", where);
    if (v[RETENTION] != NULL &&
        want_duration(ld, v[RETENTION], path, SECOND_MS, 366 * DAY_MS, &r->retention_ms) != 0)
        return -1;

    snprintf(path, sizeof path, "%s.lease", where);
    if (v[LEASE] != NULL) {
        if (want_duration(ld, v[LEASE], path, 1, 7 * DAY_MS, &r->lease_ms) != 0)
            return -1;
        /* A lease that ends while the upstream may still answer lets a retry forward again. */
        if (r->lease_ms <= cfg->upstream_timeout_ms) {
            fmt_duration(r->lease_ms, a, sizeof a);
            fmt_duration(cfg->upstream_timeout_ms, b, sizeof b);
            return fail(ld, strict_yaml_line(v[LEASE]),
                        "%s: %s is not longer than upstream.timeout (%s): "
                        "the lease must outlive the upstream timeout",
                        path, a, b);
        }
    }

    snprintf(path, sizeof path, "%s.wait", where);
    if (v[WAIT] != NULL && want_duration(ld, v[WAIT], path, 1, 60 * SECOND_MS, &r->wait_ms) != 0)
        return -1;

    snprintf(path, sizeof path, "%s.store_statuses", where);
    if (v[STORE_STATUSES] != NULL) {
        if (load_statuses(ld, v[STORE_STATUSES], path, r) != 0)
            return -1;
    } else {
        default_statuses(r);
    }

    snprintf(path, sizeof path, "%s.store_headers", where);
    if (v[STORE_HEADERS] != NULL) {
        if (load_store_headers(ld, v[STORE_HEADERS], path, r) != 0)
            return -1;
    } else {
        size_t nstripe = cfg->error_format == GW_ERRORS_STRIPE ? COUNT(stripe_store_headers) : 0;
        r->store_headers =
            xcalloc(COUNT(default_store_headers) + nstripe, sizeof *r->store_headers);
        for (i = 0; i < COUNT(default_store_headers); i++)
            r->store_headers[r->nstore_headers++] = xstrdup(default_store_headers[i]);
        for (i = 0; i < nstripe; i++)
            r->store_headers[r->nstore_headers++] = xstrdup(stripe_store_headers[i]);
    }

    snprintf(path, sizeof path, "%s.fingerprint_query", where);
    if (v[FINGERPRINT_QUERY] != NULL &&
        want_bool(ld, v[FINGERPRINT_QUERY], path, &r->fp_query) != 0)
        return -1;
    snprintf(path, sizeof path, "%s.store_retryable", where);
    if (v[STORE_RETRYABLE] != NULL &&
        want_bool(ld, v[STORE_RETRYABLE], path, &r->store_retryable) != 0)
        return -1;

    snprintf(path, sizeof path, "%s.scope_headers", where);
    if (v[SCOPE_HEADERS] != NULL &&
        load_header_names(ld, v[SCOPE_HEADERS], path, "[Stripe-Account]", not_scopable,
                          &r->scope_headers, &r->nscope_headers) != 0)
        return -1;

    snprintf(path, sizeof path, "%s.max_stored_body", where);
    if (v[MAX_STORED_BODY] != NULL) {
        if (want_size(ld, v[MAX_STORED_BODY], path, 1, GIB, &x) != 0)
            return -1;
        if ((size_t)x > cfg->max_response_bytes) {
            fmt_size(x, a, sizeof a);
            fmt_size((int64_t)cfg->max_response_bytes, b, sizeof b);
            return fail(ld, strict_yaml_line(v[MAX_STORED_BODY]),
                        "%s: %s is more than "
                        "upstream.max_response_size (%s)",
                        path, a, b);
        }
        r->max_stored_body = (size_t)x;
    }

    snprintf(path, sizeof path, "%s.on_unknown", where);
    if (v[ON_UNKNOWN] != NULL && load_on_unknown(ld, v[ON_UNKNOWN], path, r) != 0)
        return -1;
    return 0;
}

static int load_routes(struct loader *ld, const yaml_node_t *n, int have_principal,
                       struct gw_config *cfg)
{
    char shown[EXCERPT + 8];
    size_t i, count;

    if (n->type != YAML_SEQUENCE_NODE)
        return fail(ld, strict_yaml_line(n),
                    "routes: expected a list of routes (- match: ...), not %s", describe(n, shown));
    count = nitems(n);
    if (count > MAX_ROUTES)
        return fail(ld, strict_yaml_line(n), "routes: %zu routes; at most %d", count, MAX_ROUTES);
    if (count > 0 && !have_principal)
        return fail(ld, strict_yaml_line(n),
                    "routes need a principal (the first part of every scope): "
                    "add principal.header, principal.authorization or "
                    "principal.jwt");
    cfg->routes = xcalloc(count, sizeof *cfg->routes);
    cfg->nroutes = count;
    ld->seen = xcalloc(count, sizeof *ld->seen);
    ld->nseen = count;
    for (i = 0; i < count; i++) {
        yaml_node_t *item = item_at(ld, n, i);

        if (item == NULL)
            return fail(ld, strict_yaml_line(n), "malformed YAML document");
        if (load_route(ld, item, cfg, i) != 0)
            return -1;
    }
    return 0;
}

/* ---- the document ---------------------------------------------------------------------------- */

static int load_error_format(struct loader *ld, const yaml_node_t *n, struct gw_config *cfg)
{
    char shown[EXCERPT + 8];
    const char *s = n->type == YAML_SCALAR_NODE ? strict_yaml_text(n) : "";

    if (strcmp(s, "problem") == 0)
        cfg->error_format = GW_ERRORS_PROBLEM;
    else if (strcmp(s, "stripe") == 0)
        cfg->error_format = GW_ERRORS_STRIPE;
    else
        return fail(ld, strict_yaml_line(n), "error_format: expected problem or stripe, not %s",
                    describe(n, shown));
    return 0;
}

/* A name of letters, digits, '.', '_' and '-' (it starts lease owner names, before a ':'). */
static int load_instance(struct loader *ld, const yaml_node_t *n, struct gw_config *cfg)
{
    static const char what[] = "a name of letters, digits, '.', '_' and '-' such as gw-a";
    char shown[EXCERPT + 8];
    const char *s;
    size_t len;

    if (want_text(ld, n, "instance", what, &s) != 0)
        return -1;
    len = strlen(s);
    if (len == 0 || len > 64 ||
        strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != len)
        return fail(ld, strict_yaml_line(n), "instance: expected %s (at most 64), not %s", what,
                    describe(n, shown));
    cfg->instance = xstrdup(s);
    return 0;
}

/* What becomes of a request with a key on no route: `pass` (with a warning) or `refuse`. */
static int load_unrouted_keys(struct loader *ld, const yaml_node_t *n, struct gw_config *cfg)
{
    char shown[EXCERPT + 8];
    const char *s;

    if (want_text(ld, n, "unrouted_keys", "pass or refuse", &s) != 0)
        return -1;
    if (strcmp(s, "pass") != 0 && strcmp(s, "refuse") != 0)
        return fail(ld, strict_yaml_line(n), "unrouted_keys: expected pass or refuse, not %s",
                    describe(n, shown));
    cfg->unrouted_keys = strcmp(s, "refuse") == 0 ? GW_UNROUTED_REFUSE : GW_UNROUTED_PASS;
    return 0;
}

static int load_document(struct loader *ld, struct gw_config *cfg)
{
    static const char *const keys[] = {
        "listen",           "admin_listen",     "store",
        "upstream",         "max_body_size",    "principal",
        "limits",           "routes",           "method_override_headers",
        "admin_token_file", "error_format",     "instance",
        "principal_limits", "max_stored_bytes", "unrouted_keys"};
    enum {
        LISTEN,
        ADMIN_LISTEN,
        STORE,
        UPSTREAM,
        MAX_BODY_SIZE,
        PRINCIPAL,
        LIMITS,
        ROUTES,
        METHOD_OVERRIDE_HEADERS,
        ADMIN_TOKEN_FILE,
        ERROR_FORMAT,
        INSTANCE,
        PRINCIPAL_LIMITS,
        MAX_STORED_BYTES,
        UNROUTED_KEYS
    };
    yaml_node_t *root = yaml_document_get_root_node(ld->doc);
    yaml_node_t *v[COUNT(keys)];
    int64_t x = 0;

    if (root == NULL || strict_yaml_is_null(root))
        return fail(ld, 1, "empty config; expected a mapping with at least upstream");
    if (collect(ld, root, "", keys, COUNT(keys), v) != 0)
        return -1;
    /* The upstream first: routes' defaults and bounds (lease, max_stored_body) depend on it. */
    if (v[UPSTREAM] == NULL)
        return missing(ld, root, "", "upstream", "upstream: url: http://HOST:PORT");
    if (load_upstream(ld, v[UPSTREAM], cfg) != 0)
        return -1;
    if (load_listen(ld, v[LISTEN], "listen", DEFAULT_LISTEN, &cfg->listen) != 0 ||
        load_listen(ld, v[ADMIN_LISTEN], "admin_listen", DEFAULT_ADMIN_LISTEN,
                    &cfg->admin_listen) != 0 ||
        load_store(ld, v[STORE], cfg) != 0)
        return -1;
    if (v[ADMIN_TOKEN_FILE] != NULL && load_admin_token(ld, v[ADMIN_TOKEN_FILE], cfg) != 0)
        return -1;
    cfg->max_body = (size_t)DEFAULT_MAX_BODY;
    if (v[MAX_BODY_SIZE] != NULL) {
        if (want_size(ld, v[MAX_BODY_SIZE], "max_body_size", 1, 64 * MIB, &x) != 0)
            return -1;
        cfg->max_body = (size_t)x;
    }
    if (v[PRINCIPAL] != NULL && load_principal(ld, v[PRINCIPAL], cfg) != 0)
        return -1;
    if (v[LIMITS] != NULL && load_limits(ld, v[LIMITS], cfg) != 0)
        return -1;
    cfg->limit_keys_in_flight = DEFAULT_KEYS_IN_FLIGHT;
    cfg->limit_new_keys_per_second = DEFAULT_NEW_KEYS_PER_SECOND;
    cfg->limit_stored_bytes = (uint64_t)DEFAULT_PRINCIPAL_STORED;
    cfg->limit_tracked = DEFAULT_TRACKED;
    cfg->max_stored_bytes = (uint64_t)DEFAULT_MAX_STORED;
    if (v[PRINCIPAL_LIMITS] != NULL && load_principal_limits(ld, v[PRINCIPAL_LIMITS], cfg) != 0)
        return -1;
    if (v[MAX_STORED_BYTES] != NULL) {
        if (want_size(ld, v[MAX_STORED_BYTES], "max_stored_bytes", 0, 1024 * 1024 * GIB, &x) != 0)
            return -1;
        cfg->max_stored_bytes = (uint64_t)x;
    }
    /* Before the routes: their default store_headers depend on it. */
    if (v[ERROR_FORMAT] != NULL && load_error_format(ld, v[ERROR_FORMAT], cfg) != 0)
        return -1;
    if (v[INSTANCE] != NULL && load_instance(ld, v[INSTANCE], cfg) != 0)
        return -1;
    if (v[ROUTES] != NULL && load_routes(ld, v[ROUTES], v[PRINCIPAL] != NULL, cfg) != 0)
        return -1;
    if (v[UNROUTED_KEYS] != NULL && load_unrouted_keys(ld, v[UNROUTED_KEYS], cfg) != 0)
        return -1;
    if (v[METHOD_OVERRIDE_HEADERS] != NULL) {
        if (load_header_names(ld, v[METHOD_OVERRIDE_HEADERS], "method_override_headers",
                              "[X-HTTP-Method-Override]", NULL, &cfg->method_override_headers,
                              &cfg->nmethod_override_headers) != 0)
            return -1;
    } else {
        cfg->method_override_headers =
            xcalloc(COUNT(default_method_override_headers) + 1, sizeof(char *));
        for (size_t i = 0; i < COUNT(default_method_override_headers); i++)
            cfg->method_override_headers[i] = xstrdup(default_method_override_headers[i]);
        cfg->nmethod_override_headers = COUNT(default_method_override_headers);
    }
    return 0;
}

int gw_config_parse(const char *name, const char *text, size_t len, struct gw_config **out,
                    char *err, size_t errlen)
{
    struct loader ld;
    struct strict_yaml_refusal why;
    yaml_document_t doc;
    struct gw_config *cfg = NULL;
    int doc_ready = 0, rc = -1;
    size_t i;

    memset(&ld, 0, sizeof ld);
    ld.name = name != NULL ? name : "config";
    ld.err = err;
    ld.errlen = errlen;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    *out = NULL;
    if (text == NULL)
        text = "";
    if (len > CONFIG_MAX_BYTES) {
        fail(&ld, 0, "larger than 1MiB; a gateway config is a few KiB");
        goto out;
    }
    if (strict_yaml_load(text, len, MAX_DEPTH, &doc, &why) != 0) {
        fail(&ld, why.line, "%s", why.text);
        goto out;
    }
    doc_ready = 1;
    ld.doc = &doc;
    cfg = xcalloc(1, sizeof *cfg);
    cfg->file = xstrdup(ld.name);
    if (load_document(&ld, cfg) != 0)
        goto out;
    *out = cfg;
    cfg = NULL;
    rc = 0;
out:
    gw_config_free(cfg);
    for (i = 0; i < ld.nseen; i++)
        free(ld.seen[i].shape);
    free(ld.seen);
    if (doc_ready)
        yaml_document_delete(&doc);
    return rc;
}

int gw_config_load(const char *path, struct gw_config **out, char *err, size_t errlen)
{
    struct loader ld;
    char why[128];
    char *text = NULL;
    size_t len = 0;
    int rc;

    *out = NULL;
    if (read_or_say_why(path, CONFIG_MAX_BYTES, 0, &text, &len, why, sizeof why) != 0) {
        memset(&ld, 0, sizeof ld);
        ld.name = path;
        ld.err = err;
        ld.errlen = errlen;
        return fail(&ld, 0, "cannot read: %s", why);
    }
    rc = gw_config_parse(path, text, len, out, err, errlen);
    free(text);
    return rc;
}

static void free_strings(char **v, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void gw_config_free(struct gw_config *cfg)
{
    struct gw_route *r;
    size_t i;

    if (cfg == NULL)
        return;
    for (i = 0; i < cfg->nroutes; i++) {
        r = &cfg->routes[i];
        free(r->method);
        free(r->path);
        free(r->operation);
        free(r->key_header);
        free_strings(r->key_pointers, r->nkey_pointers);
        free_strings(r->fp_pointers, r->nfp_pointers);
        free_strings(r->store_headers, r->nstore_headers);
        free(r->reconcile_path);
        free_strings(r->reconcile_headers, r->nreconcile_headers);
        free_strings(r->scope_headers, r->nscope_headers);
    }
    free(cfg->routes);
    free_strings(cfg->method_override_headers, cfg->nmethod_override_headers);
    free(cfg->file);
    free(cfg->listen);
    free(cfg->admin_listen);
    if (cfg->admin_token != NULL)
        explicit_bzero(cfg->admin_token, strlen(cfg->admin_token));
    free(cfg->admin_token);
    free(cfg->store);
    free(cfg->store_file);
    free(cfg->instance);
    free(cfg->upstream_url);
    free(cfg->upstream_host);
    free(cfg->principal_header);
    if (cfg->jwt_key != NULL)
        explicit_bzero(cfg->jwt_key, cfg->jwt_key_len);
    free(cfg->jwt_key);
    free(cfg->jwt_issuer);
    free(cfg->jwt_audience);
    free(cfg);
}
