/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.c - idem-gateway's configuration reader (config.h): YAML text through libyaml's document
 * API into struct gw_config, every value checked against what the gateway can honour before the
 * program opens a socket or the store.
 *
 * The text is loaded by the programs' one strict YAML reader (src/util/strict_yaml.c), which
 * refuses what libyaml's document API would silently accept: aliases, a second document, nesting
 * deeper than any config needs (MAX_DEPTH).  Every key is then a row of a table, one table per
 * mapping (the top level, upstream, principal, principal.jwt, principal_limits, a route, its key,
 * its on_unknown), as Redis's static_configs[] is for redis.conf: the row names the key, its type,
 * bounds and default and the field it fills, or a reader of its own for a value of another shape.
 * read_section() reads a mapping by its rows: collect() refuses unknown and duplicate keys in
 * document order, then each row is read (or defaulted) in the table's order, then the section's
 * rules across its own keys run.  What a key means for another section's (a route's lease and
 * upstream.timeout) is checked once, in check_rules(), after the whole document.  Adding a key is
 * adding a row (and its line in docs/gateway.md's reference, which the tests hold to the rows).
 *
 * Every message is one line, "<file>:<line>: <path>: <what is wrong, what is expected>", with the
 * line of the node at fault (libyaml's start_mark.line + 1).
 *
 * Why ~2,200 lines: the checks of values that are more than a number (route templates, URLs,
 * header lists, reconcile queries) are most of it; the generic YAML part is src/util/strict_yaml.c.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml.h>

#include "strict_yaml.h"
#include "util.h"
#include "banned.h"

#define CONFIG_MAX_BYTES ((size_t)1 << 20)    /* a real config is a few KiB */
#define KEY_FILE_MAX_BYTES ((size_t)64 << 10) /* a JWT secret or a PEM public key */
#define MAX_ROUTES 1000
#define MAX_DEPTH 16 /* the deepest config is 5 levels: routes[i].key.body */
#define MAX_KEYS 20  /* keys of the widest mapping (the top level has 17) */
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

/* The upstream may answer until its timeout; a forward's lease lasts this much longer by default.
 */
#define LEASE_MARGIN_MS (10 * SECOND_MS)

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const default_store_headers[] = {"Content-Type", "Location", "ETag", "Link",
                                                    NULL};
/* With error_format: stripe, replays also keep what Stripe's clients log and check. */
static const char *const stripe_store_headers[] = {"Request-Id", "Stripe-Version", NULL};
/* The method-override headers of Express's method-override, Symfony, Rails and Google's APIs. */
static const char *const default_method_override_headers[] = {
    "X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", NULL};

/* Statuses of 2xx and 4xx that are not stored by default: each says nothing about the write. */
static const int default_unstored[] = {400, 401, 403, 408, 413, 415, 429};

/* What later routes are compared with, and what the rules pass needs of each route. */
struct seen_route {
    char *shape;        /* "POST /v1/orders/{}/refunds": the match with its parameters blanked */
    int match_line;     /* where that match is written */
    int operation_line; /* and that operation */
    yaml_node_t *values[MAX_KEYS]; /* its keys' nodes, by row of route_keys[] (NULL: absent) */
};

struct loader {
    const char *name; /* the file, for messages and for the key files' directory */
    yaml_document_t *doc;
    char *err;
    size_t errlen;
    struct gw_config *cfg;   /* being filled */
    size_t route;            /* the route being read, for the readers of its keys */
    struct seen_route *seen; /* per route read so far, for the duplicate checks */
    size_t nseen;
};

/*
 * The keys of the file: one row each, per mapping (a section), as Redis's static_configs[] reads
 * redis.conf.  A row names its key, its type and bounds, its default and the field it fills (an
 * offset into the section's struct), or the reader of its own for a value of another shape.  The
 * rows' order is the order of "expected one of:" in messages, and the order the keys are read in.
 * What one key's value means for another's (a lease longer than upstream.timeout) is checked once
 * the whole document is read, in check_rules().
 */
enum key_type {
    KEY_BOOL,     /* true or false, into an int */
    KEY_INT,      /* an integer in [min, max], into an int */
    KEY_DURATION, /* milliseconds in [min, max] (500ms, 30s, 15m, 24h, 7d; bare: ms) */
    KEY_SIZE,     /* bytes in [min, max] (512KiB, 1MiB, 1GiB; bare: bytes) */
    KEY_TEXT,     /* any text, into a char * (new) */
    KEY_ENUM,     /* one of the row's words, into an int-sized field */
    KEY_SECTION,  /* a mapping read by its own rows (`sub`) into the struct at `offset` */
    KEY_CUSTOM,   /* its own reader (`read`) */
};

#define KEY_REQUIRED 1u /* absent: "missing required key" with `example` */
#define KEY_DERIVED 2u  /* absent: no default here, check_rules() or the section's rules set it */
#define KEY_LIST 4u     /* a list of mappings, each read by `sub` ("routes[]") */
#define KEY_FORM 8u     /* `sub` is one form of this key's value, documented with the key */
#define KEY_OPEN 16u    /* its keys are another table's (limits: the HTTP layer's flags) */
#define KEY_READS_DEFAULT 32u /* a custom row whose reader applies its default (given n NULL) */

struct word {
    const char *word;
    int value;
};

struct conf_key;
struct conf_section;

/*
 * A custom row's reader: `n` is the value at `path`, or NULL when the key is absent and the row
 * is KEY_READS_DEFAULT (its default: def_text, def_list).  `base` is the section's struct.
 */
typedef int (*key_reader)(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                          const char *path, void *base);

struct conf_key {
    const char *name;
    enum key_type type;
    unsigned flags;
    size_t offset, size;            /* the field in the section's struct (FIELD_OF) */
    size_t count_offset;            /* a list's count, its strings being at `offset` (LIST) */
    int64_t min, max;               /* KEY_INT, KEY_DURATION, KEY_SIZE */
    int64_t def;                    /* their default, and a KEY_BOOL's */
    const char *def_text;           /* KEY_ENUM's default word; a custom row's default value */
    const char *const *def_list;    /* a list's default, NULL-terminated */
    const char *doc;                /* a default that is no value ("the host's name") */
    const char *what;               /* KEY_TEXT, KEY_ENUM: what is expected, "pass or refuse" */
    const char *example;            /* KEY_REQUIRED: what to write, for "missing required key" */
    const struct word *words;       /* KEY_ENUM, up to {NULL} */
    const struct conf_section *sub; /* KEY_SECTION; a custom row's mapping of its own */
    key_reader read;                /* KEY_CUSTOM */
};

struct conf_section {
    const struct conf_key *keys;
    size_t nkeys;
    /*
     * Rules across this section's own keys, once every row is read (values[i]: keys[i]'s node, or
     * NULL; `map` NULL when the section is absent), or NULL.
     */
    int (*rules)(struct loader *ld, const yaml_node_t *map, const char *where,
                 yaml_node_t *const *values, void *base);
};

#define FIELD_OF(type, f) .offset = offsetof(type, f), .size = sizeof(((type *)0)->f)
#define CFG(f) FIELD_OF(struct gw_config, f)
#define ROUTE(f) FIELD_OF(struct gw_route, f)
#define LISTENER_TLS(f) FIELD_OF(struct gw_listen_tls, f)
#define LIST(type, f) .offset = offsetof(type, f), .count_offset = offsetof(type, n##f)
/* clang-format off */
#define SECTION(rows, rules) {rows, COUNT(rows), rules}
/* clang-format on */

static int read_section(struct loader *ld, const struct conf_section *sec, const yaml_node_t *map,
                        const char *where, void *base);

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
 * Reads mapping `map` whose keys are the rows of `sec`: values[i] is the value of row i, or NULL.
 * An unknown key, a repeated key or a key that is not a name is an error.  `where` names the
 * mapping in messages ("routes[2]"; "" for the top level).
 */
static int collect(struct loader *ld, const yaml_node_t *map, const char *where,
                   const struct conf_section *sec, yaml_node_t **values)
{
    yaml_node_t *key_nodes[MAX_KEYS];
    const yaml_node_pair_t *pair;
    char place[96], expected[256], what[EXCERPT + 8], shown[EXCERPT + 4];
    size_t i, used, nkeys = sec->nkeys;

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
            if (k->data.scalar.length == strlen(sec->keys[i].name) &&
                strcmp(strict_yaml_text(k), sec->keys[i].name) == 0)
                break;
        }
        if (i == nkeys || i == MAX_KEYS) {
            expected[0] = '\0';
            used = 0;
            for (i = 0; i < nkeys && used < sizeof expected; i++) {
                snprintf(expected + used, sizeof expected - used, "%s%s", i ? ", " : "",
                         sec->keys[i].name);
                used += strlen(expected + used);
            }
            return fail(ld, strict_yaml_line(k), "unknown key \"%s\" %s; expected one of: %s",
                        excerpt(strict_yaml_text(k), shown), place, expected);
        }
        if (key_nodes[i] != NULL)
            return fail(ld, strict_yaml_line(k), "duplicate key \"%s\" %s (first at line %d)",
                        sec->keys[i].name, place, strict_yaml_line(key_nodes[i]));
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

/* ---- readers of the top level's own keys ----------------------------------------------------- */

static char **field_text(const struct conf_key *row, void *base)
{
    return (char **)((char *)base + row->offset);
}

/* `listen`, `admin_listen`: HOST:PORT as the HTTP layer takes it (absent: the row's default). */
static int read_listen(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                       const char *path, void *base)
{
    char host[256], why[256];
    const char *s = row->def_text;
    uint16_t port;

    if (n != NULL) {
        if (want_text(ld, n, path, "an address such as 127.0.0.1:8180", &s) != 0)
            return -1;
        if (http_listen_split(s, host, sizeof host, &port, why, sizeof why) != 0)
            return fail(ld, strict_yaml_line(n), "%s: %s", path, why);
    }
    *field_text(row, base) = xstrdup(s);
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
static int read_admin_token(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                            const char *path, void *base)
{
    char shown[EXCERPT + 4];
    char *file = NULL, *text = NULL;
    size_t read = 0, len, i;
    int rc = -1;

    if (read_secret_file(ld, n, path, &file, &text, &read) != 0)
        goto out;
    len = strcspn(text, "\r\n");
    while (len > 0 && (text[len - 1] == ' ' || text[len - 1] == '\t'))
        len--;
    text[len] = '\0';
    for (i = 0; i < len && text[i] > 0x20 && text[i] < 0x7f; i++)
        ;
    if (len < ADMIN_TOKEN_MIN || i != len) {
        fail(ld, strict_yaml_line(n),
             "%s: %s must hold a token of at least %d visible ASCII characters "
             "on its first line (e.g. openssl rand -hex 32)",
             path, excerpt(file, shown), ADMIN_TOKEN_MIN);
        goto out;
    }
    *field_text(row, base) = xstrdup(text);
    rc = 0;
out:
    secret_free(text, read);
    free(file);
    return rc;
}

/* `store`: only the kind is told apart here (the store opens the rest); absent: the default. */
static int read_store(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                      const char *path, void *base)
{
    static const char what[] = "sqlite:PATH, a postgresql:// URI, a libpq key=value string, or "
                               "shards: and the URI of a shard directory";
    struct gw_config *cfg = base;
    char shown[EXCERPT + 8];
    const char *s = row->def_text, *pg;
    int known;

    if (n != NULL) {
        if (want_text(ld, n, path, what, &s) != 0)
            return -1;
        /* "shards:URI": a shard set (docs/shards.md), its directory at URI (PostgreSQL). */
        pg = strncmp(s, "shards:", 7) == 0 ? s + 7 : s;
        known = (pg == s && strncmp(s, "sqlite:", 7) == 0) || strncmp(pg, "postgres://", 11) == 0 ||
                strncmp(pg, "postgresql://", 13) == 0 || (pg[0] != '\0' && strchr(pg, '=') != NULL);
        if (!known)
            return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, what,
                        describe(n, shown));
    }
    if (strncmp(s, "sqlite:", 7) == 0) {
        /* "sqlite:PATH", "sqlite://PATH" or "sqlite:///ABS": a relative PATH is beside the config,
         * so serve, check-config and keys open one file whichever directory they run in. */
        const char *file = s + 7;
        if (strncmp(file, "//", 2) == 0)
            file += 2;
        if (*file == '\0')
            return fail(ld, strict_yaml_line(n), "%s: sqlite: names no file", path);
        cfg->store_file = beside_config(ld->name, file);
        cfg->store = xmalloc(strlen(cfg->store_file) + 8);
        memcpy(cfg->store, "sqlite:", 7);
        memcpy(cfg->store + 7, cfg->store_file, strlen(cfg->store_file) + 1);
        return 0;
    }
    cfg->store = xstrdup(s);
    return 0;
}

/*
 * `upstream.url`: "http://HOST:PORT" or "http://[V6]:PORT", an optional trailing '/', no more; or
 * the same with https, whose port may be left out (443).
 */
static int read_upstream_url(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                             const char *path, void *base)
{
    static const char what[] = "http://HOST:PORT, http://[V6]:PORT or https://HOST[:PORT]";
    struct gw_config *cfg = base;
    char hostport[300], host[256], why[256], shown[EXCERPT + 8];
    const char *url, *authority, *rest, *close;
    size_t alen, scheme_len;
    uint16_t port = 0;
    int tls, has_port;

    (void)row;
    if (want_text(ld, n, path, what, &url) != 0)
        return -1;
    tls = ascii_ncaseeq(url, "https://", 8);
    if (!tls && !ascii_ncaseeq(url, "http://", 7))
        return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, what,
                    describe(n, shown));
    scheme_len = tls ? 8 : 7;
    authority = url + scheme_len;
    alen = strcspn(authority, "/?#");
    rest = authority + alen;
    if (memchr(authority, '@', alen) != NULL)
        return fail(ld, strict_yaml_line(n),
                    "%s: no user information (user@) is allowed; expected %s", path, what);
    if (rest[0] != '\0' && strcmp(rest, "/") != 0)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected %s without a path, query or "
                    "fragment (requests keep their own path), not %s",
                    path, what, describe(n, shown));
    if (alen + 4 >= sizeof hostport)
        return fail(ld, strict_yaml_line(n), "%s: the host is too long", path);
    memcpy(hostport, authority, alen);
    hostport[alen] = '\0';
    close = hostport[0] == '[' ? strchr(hostport, ']') : NULL;
    has_port = strchr(close ? close : hostport, ':') != NULL;
    if (tls && !has_port)
        memcpy(hostport + alen, ":443", 5);
    if (http_listen_split(hostport, host, sizeof host, &port, why, sizeof why) != 0 || port == 0)
        return fail(ld, strict_yaml_line(n), "%s: expected %s with a port from 1 to 65535, not %s",
                    path, what, describe(n, shown));
    /* Nothing is resolved here, but a host no resolver accepts is a typo worth saying now. */
    if (hostport[0] == '['
            ? strspn(host, "0123456789abcdefABCDEF:.") != strlen(host) || strchr(host, ':') == NULL
            : strspn(host, "0123456789abcdefghijklmnopqrstuvwxyz"
                           "ABCDEFGHIJKLMNOPQRSTUVWXYZ.-_") != strlen(host))
        return fail(ld, strict_yaml_line(n), "%s: \"%s\" is not a host name or an IP address", path,
                    excerpt(host, shown));
    cfg->upstream_url = xstrndup(url, scheme_len + alen); /* without the trailing '/' */
    cfg->upstream_host = xstrdup(host);
    cfg->upstream_port = port;
    cfg->upstream_tls = tls;
    return 0;
}

/* `upstream.tls.*_file`: a readable regular file, its path relative to the config's directory. */
static int read_tls_file(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                         const char *path, void *base)
{
    char shown[EXCERPT + 4];
    const char *written, *why = NULL;
    struct stat st;
    char *file;

    if (want_text(ld, n, path, "a file name", &written) != 0)
        return -1;
    file = beside_config(ld->name, written);
    if (stat(file, &st) != 0)
        why = strerror(errno);
    else if (!S_ISREG(st.st_mode))
        why = "not a regular file";
    else if (access(file, R_OK) != 0)
        why = strerror(errno);
    if (why != NULL) {
        fail(ld, strict_yaml_line(n), "%s: cannot read %s: %s", path, excerpt(file, shown), why);
        free(file);
        return -1;
    }
    *field_text(row, base) = file;
    return 0;
}

/* `upstream.tls.server_name`: the DNS name (or address) the upstream's certificate must carry. */
static int read_tls_server_name(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                                const char *path, void *base)
{
    static const char what[] = "a host name such as api.example.com";
    char shown[EXCERPT + 8];
    const char *s;
    size_t len;

    if (want_text(ld, n, path, what, &s) != 0)
        return -1;
    len = strlen(s);
    if (len == 0 || len > 253 ||
        strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:") != len)
        return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, what,
                    describe(n, shown));
    *field_text(row, base) = xstrdup(s);
    return 0;
}

/* `instance`: a name of letters, digits, '.', '_' and '-' (it starts lease owner names). */
static int read_instance(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                         const char *path, void *base)
{
    static const char what[] = "a name of letters, digits, '.', '_' and '-' such as gw-a";
    char shown[EXCERPT + 8];
    const char *s;
    size_t len;

    if (want_text(ld, n, path, what, &s) != 0)
        return -1;
    len = strlen(s);
    if (len == 0 || len > 64 ||
        strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != len)
        return fail(ld, strict_yaml_line(n), "%s: expected %s (at most 64), not %s", path, what,
                    describe(n, shown));
    *field_text(row, base) = xstrdup(s);
    return 0;
}

/* ---- principal ------------------------------------------------------------------------------- */

/* `principal.jwt.secret_file` (hs256) or `public_key_file`: the key's bytes, checked for its alg.
 */
static int read_jwt_key(struct loader *ld, const yaml_node_t *n, const char *path, int hs256,
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

/* `alg` is read first (its row comes first): each key file belongs to one alg. */
static int read_jwt_secret(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                           const char *path, void *base)
{
    struct gw_config *cfg = base;

    (void)row;
    if (cfg->jwt_alg != GW_JWT_HS256)
        return fail(ld, strict_yaml_line(n), "%s: only for alg HS256; RS256 takes public_key_file",
                    path);
    return read_jwt_key(ld, n, path, 1, cfg);
}

static int read_jwt_public_key(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                               const char *path, void *base)
{
    struct gw_config *cfg = base;

    (void)row;
    if (cfg->jwt_alg != GW_JWT_RS256)
        return fail(ld, strict_yaml_line(n), "%s: only for alg RS256; HS256 takes secret_file",
                    path);
    return read_jwt_key(ld, n, path, 0, cfg);
}

static int read_principal_header(struct loader *ld, const struct conf_key *row,
                                 const yaml_node_t *n, const char *path, void *base)
{
    struct gw_config *cfg = base;
    const char *s;

    (void)row;
    if (want_header_name(ld, n, path, &s) != 0)
        return -1;
    /* A raw credential must not become a scope, stored in clear in every record. */
    if (ascii_caseeq(s, "Authorization"))
        return fail(ld, strict_yaml_line(n),
                    "%s: Authorization holds a credential; use principal.authorization: sha256, "
                    "which keys on its SHA-256",
                    path);
    cfg->principal = GW_PRINCIPAL_HEADER;
    cfg->principal_header = xstrdup(s);
    return 0;
}

static int read_principal_authorization(struct loader *ld, const struct conf_key *row,
                                        const yaml_node_t *n, const char *path, void *base)
{
    struct gw_config *cfg = base;
    char shown[EXCERPT + 8];
    const char *s = NULL;

    (void)row;
    if (want_text(ld, n, path, "sha256", &s) != 0)
        return -1;
    if (strcmp(s, "sha256") != 0)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected sha256 (the only digest offered), not %s", path,
                    describe(n, shown));
    cfg->principal = GW_PRINCIPAL_AUTHORIZATION;
    return 0;
}

/* `principal`: a mapping of one source, or the shorthand `principal: authorization`. */
static int read_principal(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                          const char *path, void *base)
{
    struct gw_config *cfg = base;
    char shown[EXCERPT + 8];

    if (n->type == YAML_SCALAR_NODE && strcmp(strict_yaml_text(n), "authorization") == 0) {
        cfg->principal = GW_PRINCIPAL_AUTHORIZATION;
        return 0;
    }
    if (n->type != YAML_MAPPING_NODE)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected a mapping with one of header, authorization or jwt, not %s", path,
                    describe(n, shown));
    return read_section(ld, row->sub, n, path, base);
}

/* ---- limits ---------------------------------------------------------------------------------- */

#define LIMIT_FLAG_NAME(name, field, min, max) name,
static const char *const limit_flags[] = {HTTP_LIMITS_FLAGS(LIMIT_FLAG_NAME)};
#undef LIMIT_FLAG_NAME

/*
 * `limits:` takes the serve flags' names with '_' for '-'; http_limits_flag() checks the values,
 * so these rows are made here from the HTTP layer's table rather than written twice.
 */
static int read_limits(struct loader *ld, const struct conf_key *row, const yaml_node_t *map,
                       const char *where, void *base)
{
    struct gw_config *cfg = base;
    char names[COUNT(limit_flags)][40];
    struct conf_key rows[COUNT(limit_flags)];
    const struct conf_section sec = {rows, COUNT(rows), NULL};
    yaml_node_t *v[COUNT(limit_flags)];
    char path[96], why[256];
    const char *s = NULL, *sentence;
    size_t i, j, flag_len;

    (void)row;
    memset(rows, 0, sizeof rows);
    for (i = 0; i < COUNT(limit_flags); i++) {
        snprintf(names[i], sizeof names[i], "%s", limit_flags[i]);
        for (j = 0; names[i][j] != '\0'; j++) {
            if (names[i][j] == '-')
                names[i][j] = '_';
        }
        rows[i].name = names[i];
    }
    if (collect(ld, map, where, &sec, v) != 0)
        return -1;
    for (i = 0; i < COUNT(limit_flags); i++) {
        if (v[i] == NULL)
            continue;
        snprintf(path, sizeof path, "%.40s.%.39s", where, names[i]);
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
static int read_match(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                      const char *path, void *base)
{
    static const char what[] = "\"METHOD /path\" such as \"POST /v1/orders/{id}/refunds\"";
    struct gw_route *r = base;
    size_t index = ld->route;
    char shape[MAX_MATCH_LEN + 8], shown[EXCERPT + 8];
    const char *s, *sp;
    size_t mlen, i;

    (void)row;
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

static int read_operation(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                          const char *path, void *base)
{
    static const char what[] = "an operation name such as payments.create ([A-Za-z0-9._-], at "
                               "most 64)";
    struct gw_route *r = base;
    size_t index = ld->route;
    char shown[EXCERPT + 8];
    const char *s;
    size_t i, len;

    (void)row;
    if (want_text(ld, n, path, what, &s) != 0)
        return -1;
    len = strlen(s);
    if (len == 0 || len > MAX_OPERATION_LEN ||
        strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != len)
        return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, what,
                    describe(n, shown));
    /* The operation is the scope's middle part: two routes sharing it would share records. */
    for (i = 0; i < index; i++) {
        if (strcmp(ld->cfg->routes[i].operation, s) == 0)
            return fail(ld, strict_yaml_line(n),
                        "%s: \"%s\" is already the operation of routes[%zu] at "
                        "line %d; each route needs its own",
                        path, s, i, ld->seen[i].operation_line);
    }
    r->operation = xstrdup(s);
    ld->seen[index].operation_line = strict_yaml_line(n);
    return 0;
}

static int read_key_header(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                           const char *path, void *base)
{
    const char *s;

    if (want_header_name(ld, n, path, &s) != 0)
        return -1;
    *field_text(row, base) = xstrdup(s);
    return 0;
}

static int read_key_body(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                         const char *path, void *base)
{
    struct gw_route *r = base;

    (void)row;
    r->key_source = GW_KEY_BODY;
    return want_pointers(ld, n, path, &r->key_pointers, &r->nkey_pointers);
}

/* The words a scalar value may be, or NULL (the text compared as C text, as written). */
static const struct word *find_word(const struct word *words, const char *s)
{
    for (; words->word != NULL; words++) {
        if (strcmp(s, words->word) == 0)
            return words;
    }
    return NULL;
}

static const struct word fingerprint_words[] = {
    {"body", GW_FP_BODY_ALL}, {"none", GW_FP_BODY_NONE}, {NULL, 0}};

/* `fingerprint`: body, none, or a list of JSON pointers. */
static int read_fingerprint(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                            const char *path, void *base)
{
    struct gw_route *r = base;
    const struct word *w = NULL;
    char shown[EXCERPT + 8];

    if (n != NULL && n->type == YAML_SEQUENCE_NODE) {
        r->fp_body = GW_FP_BODY_POINTERS;
        return want_pointers(ld, n, path, &r->fp_pointers, &r->nfp_pointers);
    }
    if (n == NULL)
        w = find_word(fingerprint_words, row->def_text);
    else if (n->type == YAML_SCALAR_NODE)
        w = find_word(fingerprint_words, strict_yaml_text(n));
    if (w == NULL)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected body, none or a list of JSON pointers such as "
                    "[/amount, /currency], not %s",
                    path, describe(n, shown));
    r->fp_body = (enum gw_fp_body)w->value;
    return 0;
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

/*
 * `store_statuses`: a list of classes ("2xx") and statuses (404), exactly the statuses stored;
 * never a 5xx.  Absent: default_statuses().
 */
static int read_statuses(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                         const char *path, void *base)
{
    static const char what[] = "a status class such as 2xx or a status from 100 to 499";
    struct gw_route *r = base;
    char item_path[96], shown[EXCERPT + 8];
    const char *s;
    int64_t status;
    size_t i;
    int cls, k;

    (void)row;
    if (n == NULL) {
        default_statuses(r);
        return 0;
    }
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

/* A list's fields: the strings at the row's offset, their count at its count_offset. */
static char ***list_names(const struct conf_key *row, void *base)
{
    return (char ***)((char *)base + row->offset);
}

static size_t *list_count(const struct conf_key *row, void *base)
{
    return (size_t *)((char *)base + row->count_offset);
}

/* A copy of the row's default list, and `extra` after it (absent key). */
static void default_names(const struct conf_key *row, const char *const *extra, void *base)
{
    char ***names = list_names(row, base);
    size_t *count = list_count(row, base);
    size_t n = 0, m = 0, i;

    while (row->def_list[n] != NULL)
        n++;
    while (extra != NULL && extra[m] != NULL)
        m++;
    *names = xcalloc(n + m + 1, sizeof **names);
    for (i = 0; i < n; i++)
        (*names)[(*count)++] = xstrdup(row->def_list[i]);
    for (i = 0; i < m; i++)
        (*names)[(*count)++] = xstrdup(extra[i]);
}

static int read_store_headers(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                              const char *path, void *base)
{
    return load_header_names(ld, n, path, "[Content-Type, Location]", not_storable,
                             list_names(row, base), list_count(row, base));
}

static int read_scope_headers(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                              const char *path, void *base)
{
    return load_header_names(ld, n, path, "[Stripe-Account]", not_scopable, list_names(row, base),
                             list_count(row, base));
}

static int read_reconcile_headers(struct loader *ld, const struct conf_key *row,
                                  const yaml_node_t *n, const char *path, void *base)
{
    return load_header_names(ld, n, path, "[X-Tenant]", NULL, list_names(row, base),
                             list_count(row, base));
}

static int read_method_override_headers(struct loader *ld, const struct conf_key *row,
                                        const yaml_node_t *n, const char *path, void *base)
{
    if (n == NULL) {
        default_names(row, NULL, base);
        return 0;
    }
    return load_header_names(ld, n, path, "[X-HTTP-Method-Override]", NULL, list_names(row, base),
                             list_count(row, base));
}

/*
 * `on_unknown.reconcile`: "GET /path?query" with placeholders {key} and the route's own {params}
 * only: the gateway fills them in, and any other name in braces would be sent as written.
 */
static int read_reconcile(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                          const char *path, void *base)
{
    static const char what[] = "\"GET /path\" such as \"GET /v1/orders?requestId={key}\"";
    struct gw_route *r = base;
    char shown[EXCERPT + 8];
    const char *s, *p, *close;
    size_t len;

    (void)row;
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

static const struct word unknown_words[] = {
    {"hold", GW_UNKNOWN_HOLD}, {"resend", GW_UNKNOWN_RESEND}, {NULL, 0}};

/* `on_unknown`: hold, resend, or the mapping of a reconcile query (`sub`). */
static int read_on_unknown(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                           const char *path, void *base)
{
    struct gw_route *r = base;
    const struct word *w = NULL;
    char shown[EXCERPT + 8];

    if (n != NULL && n->type == YAML_MAPPING_NODE)
        return read_section(ld, row->sub, n, path, base);
    if (n == NULL)
        w = find_word(unknown_words, row->def_text);
    else if (n->type == YAML_SCALAR_NODE)
        w = find_word(unknown_words, strict_yaml_text(n));
    if (w == NULL)
        return fail(ld, strict_yaml_line(n),
                    "%s: expected hold, resend or {reconcile: \"GET /path\"}, not %s", path,
                    describe(n, shown));
    r->unknown = (enum gw_unknown_mode)w->value;
    return 0;
}

/* `routes`: a list of mappings, each read by the route's rows (`sub`). */
static int read_routes(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                       const char *path, void *base)
{
    struct gw_config *cfg = base;
    char shown[EXCERPT + 8], where[32];
    size_t i, count;

    if (n->type != YAML_SEQUENCE_NODE)
        return fail(ld, strict_yaml_line(n), "%s: expected a list of routes (- match: ...), not %s",
                    path, describe(n, shown));
    count = nitems(n);
    if (count > MAX_ROUTES)
        return fail(ld, strict_yaml_line(n), "%s: %zu routes; at most %d", path, count, MAX_ROUTES);
    cfg->routes = xcalloc(count, sizeof *cfg->routes);
    cfg->nroutes = count;
    ld->seen = xcalloc(count, sizeof *ld->seen);
    ld->nseen = count;
    for (i = 0; i < count; i++) {
        yaml_node_t *item = item_at(ld, n, i);

        if (item == NULL)
            return fail(ld, strict_yaml_line(n), "malformed YAML document");
        snprintf(where, sizeof where, "%s[%zu]", path, i);
        cfg->routes[i].line = strict_yaml_line(item);
        ld->route = i;
        if (read_section(ld, row->sub, item, where, &cfg->routes[i]) != 0)
            return -1;
    }
    return 0;
}

/* The sections' rules (after the rows, which name them). */
static int jwt_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                     yaml_node_t *const *values, void *base);
static int principal_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                           yaml_node_t *const *values, void *base);
static int key_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                     yaml_node_t *const *values, void *base);
static int route_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                       yaml_node_t *const *values, void *base);
static int upstream_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                          yaml_node_t *const *values, void *base);
static int upstream_tls_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                              yaml_node_t *const *values, void *base);
static int listen_tls_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                            yaml_node_t *const *values, void *base);
static int check_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                       yaml_node_t *const *values, void *base);

/* ---- the rows -------------------------------------------------------------------------------- */

/*
 * Rows of the common types, as Redis's createIntConfig(): name, field, bounds, default.  The
 * tables read best a row a line (or two), so clang-format leaves them alone.
 */
/* clang-format off */
#define BOOL_KEY(n, field, d) {.name = n, .type = KEY_BOOL, field, .def = d}
#define INT_KEY(n, field, lo, hi, d) \
    {.name = n, .type = KEY_INT, field, .min = lo, .max = hi, .def = d}
#define DURATION_KEY(n, field, lo, hi, d) \
    {.name = n, .type = KEY_DURATION, field, .min = lo, .max = hi, .def = d}
#define SIZE_KEY(n, field, lo, hi, d) \
    {.name = n, .type = KEY_SIZE, field, .min = lo, .max = hi, .def = d}
#define ENUM_KEY(n, field, w, d, expected) \
    {.name = n, .type = KEY_ENUM, field, .words = w, .def_text = d, .what = expected}
#define TEXT_KEY(n, field, expected) {.name = n, .type = KEY_TEXT, field, .what = expected}
#define SECTION_KEY(n, s) {.name = n, .type = KEY_SECTION, .sub = s}
#define SECTION_AT(n, s, field) {.name = n, .type = KEY_SECTION, .sub = s, CFG(field)}
#define CUSTOM_KEY(n, reader) {.name = n, .type = KEY_CUSTOM, .read = reader}

static const struct word keyed_connections_words[] = {{"pooled", 0}, {"fresh", 1}, {NULL, 0}};
static const struct word jwt_alg_words[] = {
    {"HS256", GW_JWT_HS256}, {"RS256", GW_JWT_RS256}, {NULL, 0}};
static const struct word forward_words[] = {{"token", 1}, {"sf-string", 0}, {NULL, 0}};
static const struct word error_format_words[] = {
    {"problem", GW_ERRORS_PROBLEM}, {"stripe", GW_ERRORS_STRIPE}, {NULL, 0}};
static const struct word unrouted_words[] = {
    {"pass", GW_UNROUTED_PASS}, {"refuse", GW_UNROUTED_REFUSE}, {NULL, 0}};

/* Both listeners' (listen_tls, admin_listen_tls), each read into its struct gw_listen_tls. */
static const struct conf_key listen_tls_keys[] = {
    {.name = "cert_file", .type = KEY_CUSTOM, LISTENER_TLS(cert_file), .doc = "required",
     .read = read_tls_file},
    {.name = "key_file", .type = KEY_CUSTOM, LISTENER_TLS(key_file), .doc = "required",
     .read = read_tls_file},
};
static const struct conf_section listen_tls_section = SECTION(listen_tls_keys, listen_tls_rules);

static const struct conf_key upstream_tls_keys[] = {
    {.name = "ca_file", .type = KEY_CUSTOM, CFG(upstream_tls_ca_file), .doc = "the system's store",
     .read = read_tls_file},
    {.name = "server_name", .type = KEY_CUSTOM, CFG(upstream_tls_server_name),
     .doc = "the URL's host", .read = read_tls_server_name},
    {.name = "cert_file", .type = KEY_CUSTOM, CFG(upstream_tls_cert_file), .read = read_tls_file},
    {.name = "key_file", .type = KEY_CUSTOM, CFG(upstream_tls_key_file), .read = read_tls_file},
};
static const struct conf_section upstream_tls_section =
    SECTION(upstream_tls_keys, upstream_tls_rules);

static const struct conf_key upstream_keys[] = {
    {.name = "url", .type = KEY_CUSTOM, .flags = KEY_REQUIRED, .example = "url: http://HOST:PORT",
     .read = read_upstream_url},
    DURATION_KEY("connect_timeout", CFG(upstream_connect_timeout_ms), 1, HOUR_MS, 2 * SECOND_MS),
    /* Request sent to the end of the answer. */
    DURATION_KEY("timeout", CFG(upstream_timeout_ms), 1, DAY_MS, 30 * SECOND_MS),
    INT_KEY("max_connections", CFG(upstream_max_connections), 1, 10000, 64),
    SIZE_KEY("max_response_size", CFG(max_response_bytes), 1, GIB, 16 * MIB),
    /*
     * A connection an upstream sent a stray answer on can look idle at any check before reuse
     * (the answer may come later), so keyed requests, whose answers are stored, get their own.
     */
    ENUM_KEY("keyed_connections", CFG(upstream_keyed_fresh), keyed_connections_words, "fresh",
             "pooled or fresh"),
    SECTION_KEY("tls", &upstream_tls_section),
};
static const struct conf_section upstream_section = SECTION(upstream_keys, upstream_rules);

/* `alg` first: the key files' readers check that they belong to it. */
static const struct conf_key jwt_keys[] = {
    {.name = "alg", .type = KEY_ENUM, .flags = KEY_REQUIRED, CFG(jwt_alg), .words = jwt_alg_words,
     .what = "HS256 or RS256", .example = "HS256 or RS256"},
    CUSTOM_KEY("secret_file", read_jwt_secret),
    CUSTOM_KEY("public_key_file", read_jwt_public_key),
    TEXT_KEY("issuer", CFG(jwt_issuer), "the issuer (iss) expected"),
    TEXT_KEY("audience", CFG(jwt_audience), "the audience (aud) expected"),
    BOOL_KEY("require_exp", CFG(jwt_require_exp), 1),
};
static const struct conf_section jwt_section = SECTION(jwt_keys, jwt_rules);

static const struct conf_key principal_keys[] = {
    CUSTOM_KEY("header", read_principal_header),
    CUSTOM_KEY("authorization", read_principal_authorization),
    SECTION_KEY("jwt", &jwt_section),
};
static const struct conf_section principal_section = SECTION(principal_keys, principal_rules);

/*
 * What one caller may make the gateway keep; 0 turns a limit off.  The defaults are far above
 * what a client that retries (rather than floods) needs.
 */
static const struct conf_key principal_limits_keys[] = {
    INT_KEY("keys_in_flight", CFG(limit_keys_in_flight), 0, 1000000, 512),
    INT_KEY("new_keys_per_second", CFG(limit_new_keys_per_second), 0, 1000000, 1000),
    SIZE_KEY("stored_bytes", CFG(limit_stored_bytes), 0, 1024 * 1024 * GIB, GIB),
    INT_KEY("tracked", CFG(limit_tracked), 1, 10000000, 10000),
};
static const struct conf_section principal_limits_section = SECTION(principal_limits_keys, NULL);

/* What `header` and `forward` are when not written follows from `body` (key_rules()). */
static const struct conf_key key_keys[] = {
    BOOL_KEY("required", ROUTE(key_required), 1),
    {.name = "header", .type = KEY_CUSTOM, .flags = KEY_DERIVED, ROUTE(key_header),
     .def_text = "Idempotency-Key", .read = read_key_header},
    CUSTOM_KEY("body", read_key_body),
    {.name = "forward", .type = KEY_ENUM, .flags = KEY_DERIVED, ROUTE(key_forward_token),
     .words = forward_words, .def_text = "token", .what = "token or sf-string"},
};
static const struct conf_section key_section = SECTION(key_keys, key_rules);

static const struct conf_key on_unknown_keys[] = {
    {.name = "reconcile", .type = KEY_CUSTOM, .flags = KEY_REQUIRED,
     .example = "reconcile: \"GET /path?id={key}\"", .read = read_reconcile},
    {.name = "headers", .type = KEY_CUSTOM, LIST(struct gw_route, reconcile_headers),
     .read = read_reconcile_headers},
};
static const struct conf_section on_unknown_section = SECTION(on_unknown_keys, NULL);

static const struct conf_key route_keys[] = {
    {.name = "match", .type = KEY_CUSTOM, .flags = KEY_REQUIRED,
     .example = "match: POST /v1/payments", .read = read_match},
    {.name = "operation", .type = KEY_CUSTOM, .flags = KEY_REQUIRED,
     .example = "operation: payments.create", .read = read_operation},
    SECTION_KEY("key", &key_section),
    {.name = "fingerprint", .type = KEY_CUSTOM, .flags = KEY_READS_DEFAULT, .def_text = "body",
     .read = read_fingerprint},
    DURATION_KEY("retention", ROUTE(retention_ms), SECOND_MS, 366 * DAY_MS, DAY_MS),
    /* check_rules(): it outlives upstream.timeout, by LEASE_MARGIN_MS when not written. */
    {.name = "lease", .type = KEY_DURATION, .flags = KEY_DERIVED, ROUTE(lease_ms), .min = 1,
     .max = 7 * DAY_MS, .doc = "upstream.timeout + 10s"},
    DURATION_KEY("wait", ROUTE(wait_ms), 1, 60 * SECOND_MS, 2 * SECOND_MS),
    {.name = "store_statuses", .type = KEY_CUSTOM, .flags = KEY_READS_DEFAULT,
     .doc = "2xx, 4xx but 400 401 403 408 413 415 429", .read = read_statuses},
    /* check_rules(): with error_format: stripe, stripe_store_headers join the default. */
    {.name = "store_headers", .type = KEY_CUSTOM, .flags = KEY_DERIVED,
     LIST(struct gw_route, store_headers), .def_list = default_store_headers,
     .read = read_store_headers},
    /* check_rules(): at most upstream.max_response_size. */
    SIZE_KEY("max_stored_body", ROUTE(max_stored_body), 1, GIB, MIB),
    {.name = "on_unknown", .type = KEY_CUSTOM, .flags = KEY_READS_DEFAULT | KEY_FORM,
     .def_text = "hold", .sub = &on_unknown_section, .read = read_on_unknown},
    BOOL_KEY("case_sensitive", ROUTE(case_sensitive), 0),
    {.name = "scope_headers", .type = KEY_CUSTOM, LIST(struct gw_route, scope_headers),
     .read = read_scope_headers},
    BOOL_KEY("store_retryable", ROUTE(store_retryable), 0),
    BOOL_KEY("fingerprint_query", ROUTE(fp_query), 1),
};
static const struct conf_section route_section = SECTION(route_keys, route_rules);

static const struct conf_key top_keys[] = {
    /* Clear of orderd (8080) and provider-sim (8090). */
    {.name = "listen", .type = KEY_CUSTOM, .flags = KEY_READS_DEFAULT, CFG(listen),
     .def_text = "127.0.0.1:8180", .read = read_listen},
    {.name = "admin_listen", .type = KEY_CUSTOM, .flags = KEY_READS_DEFAULT, CFG(admin_listen),
     .def_text = "127.0.0.1:8181", .read = read_listen},
    {.name = "store", .type = KEY_CUSTOM, .flags = KEY_READS_DEFAULT,
     .def_text = "sqlite:gateway.db", .read = read_store},
    {.name = "upstream", .type = KEY_SECTION, .flags = KEY_REQUIRED,
     .example = "upstream: url: http://HOST:PORT", .sub = &upstream_section},
    SIZE_KEY("max_body_size", CFG(max_body), 1, 64 * MIB, MIB),
    {.name = "principal", .type = KEY_CUSTOM, .doc = "required with routes",
     .sub = &principal_section, .read = read_principal},
    {.name = "limits", .type = KEY_CUSTOM, .flags = KEY_OPEN, .read = read_limits},
    {.name = "routes", .type = KEY_CUSTOM, .flags = KEY_LIST, .sub = &route_section,
     .read = read_routes},
    {.name = "method_override_headers", .type = KEY_CUSTOM, .flags = KEY_READS_DEFAULT,
     LIST(struct gw_config, method_override_headers), .def_list = default_method_override_headers,
     .read = read_method_override_headers},
    {.name = "admin_token_file", .type = KEY_CUSTOM, CFG(admin_token), .read = read_admin_token},
    ENUM_KEY("error_format", CFG(error_format), error_format_words, "problem", "problem or stripe"),
    {.name = "instance", .type = KEY_CUSTOM, CFG(instance), .doc = "the host's name",
     .read = read_instance},
    SECTION_KEY("principal_limits", &principal_limits_section),
    /* The stored answers of every caller together. */
    SIZE_KEY("max_stored_bytes", CFG(max_stored_bytes), 0, 1024 * 1024 * GIB, 16 * GIB),
    ENUM_KEY("unrouted_keys", CFG(unrouted_keys), unrouted_words, "pass", "pass or refuse"),
    SECTION_AT("listen_tls", &listen_tls_section, listen_tls),
    SECTION_AT("admin_listen_tls", &listen_tls_section, admin_listen_tls),
};
static const struct conf_section top_section = SECTION(top_keys, check_rules);
/* clang-format on */

_Static_assert(COUNT(top_keys) <= MAX_KEYS && COUNT(route_keys) <= MAX_KEYS &&
                   COUNT(limit_flags) <= MAX_KEYS,
               "collect() reads at most MAX_KEYS keys of a mapping");

/* ---- reading rows ---------------------------------------------------------------------------- */

static const struct conf_key *row_named(const struct conf_section *sec, const char *name)
{
    size_t i;

    for (i = 0; i < sec->nkeys; i++) {
        if (strcmp(sec->keys[i].name, name) == 0)
            return &sec->keys[i];
    }
    abort(); /* a name of this file's own tables */
}

/* The node of key `name` among a section's `values` (collect()'s), or NULL. */
static yaml_node_t *value_of(const struct conf_section *sec, yaml_node_t *const *values,
                             const char *name)
{
    return values[row_named(sec, name) - sec->keys];
}

static void set_number(const struct conf_key *row, void *base, int64_t v)
{
    char *field = (char *)base + row->offset;
    int small = (int)v;

    if (row->size == sizeof small)
        memcpy(field, &small, sizeof small);
    else
        memcpy(field, &v, sizeof v);
}

/* One key's value `n` (NULL: absent) at `path` into the section's struct `base`. */
static int read_value(struct loader *ld, const struct conf_key *row, const yaml_node_t *n,
                      const char *path, void *base)
{
    const struct word *w;
    char shown[EXCERPT + 8];
    const char *s;
    int64_t x = row->def;
    int b = 0;

    if (n == NULL && (row->flags & KEY_DERIVED) != 0)
        return 0;
    switch (row->type) {
    case KEY_BOOL:
        if (n != NULL) {
            if (want_bool(ld, n, path, &b) != 0)
                return -1;
            x = b;
        }
        break;
    case KEY_INT:
        if (n != NULL && want_int(ld, n, path, row->min, row->max, &x) != 0)
            return -1;
        break;
    case KEY_DURATION:
        if (n != NULL && want_duration(ld, n, path, row->min, row->max, &x) != 0)
            return -1;
        break;
    case KEY_SIZE:
        if (n != NULL && want_size(ld, n, path, row->min, row->max, &x) != 0)
            return -1;
        break;
    case KEY_TEXT:
        if (n == NULL)
            return 0;
        if (want_text(ld, n, path, row->what, &s) != 0)
            return -1;
        *field_text(row, base) = xstrdup(s);
        return 0;
    case KEY_ENUM:
        s = row->def_text;
        if (n != NULL && want_text(ld, n, path, row->what, &s) != 0)
            return -1;
        if (s == NULL)
            return 0;
        w = find_word(row->words, s);
        if (w == NULL)
            return fail(ld, strict_yaml_line(n), "%s: expected %s, not %s", path, row->what,
                        describe(n, shown));
        x = w->value;
        break;
    case KEY_SECTION:
        return read_section(ld, row->sub, n, path, (char *)base + row->offset);
    case KEY_CUSTOM:
        if (n == NULL && (row->flags & KEY_READS_DEFAULT) == 0)
            return 0;
        return row->read(ld, row, n, path, base);
    }
    set_number(row, base, x);
    return 0;
}

/*
 * Reads mapping `map` (NULL: absent, every row's default) at `where` by the rows of `sec` into
 * `base`: unknown and repeated keys refused, required ones present, then each row in order, then
 * the section's rules.
 */
static int read_section(struct loader *ld, const struct conf_section *sec, const yaml_node_t *map,
                        const char *where, void *base)
{
    yaml_node_t *v[MAX_KEYS];
    char path[96];
    size_t i;

    memset(v, 0, sizeof v);
    if (map != NULL && collect(ld, map, where, sec, v) != 0)
        return -1;
    for (i = 0; map != NULL && i < sec->nkeys; i++) {
        if ((sec->keys[i].flags & KEY_REQUIRED) != 0 && v[i] == NULL)
            return missing(ld, map, where, sec->keys[i].name, sec->keys[i].example);
    }
    for (i = 0; i < sec->nkeys; i++) {
        if (where[0] != '\0')
            snprintf(path, sizeof path, "%s.%s", where, sec->keys[i].name);
        else
            snprintf(path, sizeof path, "%s", sec->keys[i].name);
        if (read_value(ld, &sec->keys[i], v[i], path, base) != 0)
            return -1;
    }
    return sec->rules != NULL ? sec->rules(ld, map, where, v, base) : 0;
}

/* The alg's own key file, once the section is read (given: the rows checked it belongs). */
static int jwt_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                     yaml_node_t *const *values, void *base)
{
    struct gw_config *cfg = base;

    if (map == NULL)
        return 0;
    if (cfg->jwt_alg == GW_JWT_HS256 && value_of(&jwt_section, values, "secret_file") == NULL)
        return missing(ld, map, where, "secret_file", "alg HS256 needs the secret");
    if (cfg->jwt_alg == GW_JWT_RS256 && value_of(&jwt_section, values, "public_key_file") == NULL)
        return missing(ld, map, where, "public_key_file", "alg RS256 needs the PEM public key");
    return 0;
}

/* Exactly one source; two given: point at the later one. */
static int principal_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                           yaml_node_t *const *values, void *base)
{
    size_t i, given = 0;
    int last_line = 0;

    for (i = 0; i < principal_section.nkeys; i++) {
        if (values[i] != NULL) {
            given++;
            if (strict_yaml_line(values[i]) > last_line)
                last_line = strict_yaml_line(values[i]);
        }
    }
    if (given == 0)
        return fail(ld, strict_yaml_line(map), "%s: expected one of header, authorization or jwt",
                    where);
    if (given > 1)
        return fail(ld, last_line, "%s: give only one of header, authorization and jwt", where);
    if (value_of(&principal_section, values, "jwt") != NULL)
        ((struct gw_config *)base)->principal = GW_PRINCIPAL_JWT;
    return 0;
}

/*
 * The key comes from one place; what is not written follows from where: the header's name, and
 * how the key is forwarded (bare when it came from a header, as clients send it).
 */
static int key_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                     yaml_node_t *const *values, void *base)
{
    struct gw_route *r = base;
    int header_line, body_line;

    (void)map;
    if (values[1] != NULL && values[2] != NULL) {
        header_line = strict_yaml_line(values[1]);
        body_line = strict_yaml_line(values[2]);
        return fail(ld, body_line > header_line ? body_line : header_line,
                    "%s: header and body are mutually exclusive; the key comes from one place",
                    where);
    }
    if (values[3] == NULL)
        r->key_forward_token = r->key_source != GW_KEY_BODY;
    if (r->key_source == GW_KEY_HEADER && r->key_header == NULL)
        r->key_header = xstrdup(row_named(&key_section, "header")->def_text);
    return 0;
}

/* upstream.tls is for an https upstream only. */
static int upstream_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                          yaml_node_t *const *values, void *base)
{
    const struct gw_config *cfg = base;
    const yaml_node_t *tls = value_of(&upstream_section, values, "tls");

    (void)map;
    if (tls != NULL && !cfg->upstream_tls)
        return fail(ld, strict_yaml_line(tls),
                    "%s: tls applies to an https url only; write url: https://...", where);
    return 0;
}

/* A TLS listener (listen_tls, admin_listen_tls) needs its certificate and its key. */
static int listen_tls_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                            yaml_node_t *const *values, void *base)
{
    (void)base;
    if (map == NULL)
        return 0; /* absent: plain HTTP */
    if (value_of(&listen_tls_section, values, "cert_file") == NULL ||
        value_of(&listen_tls_section, values, "key_file") == NULL)
        return fail(ld, strict_yaml_line(map),
                    "%s: expected cert_file and key_file (the certificate chain and its key)",
                    where);
    return 0;
}

/* A client certificate needs its key, and a key its certificate. */
static int upstream_tls_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                              yaml_node_t *const *values, void *base)
{
    const yaml_node_t *cert = value_of(&upstream_tls_section, values, "cert_file");
    const yaml_node_t *key = value_of(&upstream_tls_section, values, "key_file");

    (void)base;
    if ((cert == NULL) != (key == NULL))
        return fail(ld,
                    strict_yaml_line(cert  ? cert
                                     : key ? key
                                           : map),
                    "%s: cert_file and key_file go together (a client certificate and its key)",
                    where);
    return 0;
}

/* A route's nodes, for check_rules(). */
static int route_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                       yaml_node_t *const *values, void *base)
{
    (void)map;
    (void)where;
    (void)base;
    memcpy(ld->seen[ld->route].values, values, sizeof ld->seen[ld->route].values);
    return 0;
}

/* ---- rules across keys ------------------------------------------------------------------- */

/*
 * What keys mean for keys of other sections, once the whole document is read (the top level's
 * rules): routes need a principal; a route's lease outlives upstream.timeout and its stored body
 * fits upstream.max_response_size, their defaults following from those; error_format: stripe
 * adds the headers Stripe's clients check to the default store_headers.
 */
static int check_rules(struct loader *ld, const yaml_node_t *map, const char *where,
                       yaml_node_t *const *values, void *base)
{
    struct gw_config *cfg = base;
    const yaml_node_t *routes = value_of(&top_section, values, "routes");
    const yaml_node_t *lease, *stored;
    struct gw_route *r;
    char path[64], a[32], b[32];
    size_t i;

    (void)map;
    (void)where;
    if (cfg->nroutes > 0 && value_of(&top_section, values, "principal") == NULL)
        return fail(ld, strict_yaml_line(routes),
                    "routes need a principal (the first part of every scope): "
                    "add principal.header, principal.authorization or "
                    "principal.jwt");
    for (i = 0; i < cfg->nroutes; i++) {
        r = &cfg->routes[i];
        lease = value_of(&route_section, ld->seen[i].values, "lease");
        stored = value_of(&route_section, ld->seen[i].values, "max_stored_body");
        if (lease == NULL) {
            r->lease_ms = cfg->upstream_timeout_ms + LEASE_MARGIN_MS;
        } else if (r->lease_ms <= cfg->upstream_timeout_ms) {
            /* A lease that ends while the upstream may still answer lets a retry forward again. */
            snprintf(path, sizeof path, "routes[%zu].lease", i);
            fmt_duration(r->lease_ms, a, sizeof a);
            fmt_duration(cfg->upstream_timeout_ms, b, sizeof b);
            return fail(ld, strict_yaml_line(lease),
                        "%s: %s is not longer than upstream.timeout (%s): "
                        "the lease must outlive the upstream timeout",
                        path, a, b);
        }
        if (stored == NULL) {
            if (r->max_stored_body > cfg->max_response_bytes)
                r->max_stored_body = cfg->max_response_bytes;
        } else if (r->max_stored_body > cfg->max_response_bytes) {
            snprintf(path, sizeof path, "routes[%zu].max_stored_body", i);
            fmt_size((int64_t)r->max_stored_body, a, sizeof a);
            fmt_size((int64_t)cfg->max_response_bytes, b, sizeof b);
            return fail(ld, strict_yaml_line(stored),
                        "%s: %s is more than upstream.max_response_size (%s)", path, a, b);
        }
        if (value_of(&route_section, ld->seen[i].values, "store_headers") == NULL)
            default_names(row_named(&route_section, "store_headers"),
                          cfg->error_format == GW_ERRORS_STRIPE ? stripe_store_headers : NULL, r);
    }
    return 0;
}

/* ---- the document ---------------------------------------------------------------------------- */

static int load_document(struct loader *ld, struct gw_config *cfg)
{
    yaml_node_t *root = yaml_document_get_root_node(ld->doc);

    if (root == NULL || strict_yaml_is_null(root))
        return fail(ld, 1, "empty config; expected a mapping with at least upstream");
    return read_section(ld, &top_section, root, "", cfg);
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
    ld.cfg = cfg;
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
    free(cfg->listen_tls.cert_file);
    free(cfg->listen_tls.key_file);
    free(cfg->admin_listen_tls.cert_file);
    free(cfg->admin_listen_tls.key_file);
    free(cfg->upstream_tls_ca_file);
    free(cfg->upstream_tls_server_name);
    free(cfg->upstream_tls_cert_file);
    free(cfg->upstream_tls_key_file);
    free(cfg->principal_header);
    if (cfg->jwt_key != NULL)
        explicit_bzero(cfg->jwt_key, cfg->jwt_key_len);
    free(cfg->jwt_key);
    free(cfg->jwt_issuer);
    free(cfg->jwt_audience);
    free(cfg);
}

/* ---- the rows, for the reference ------------------------------------------------------------- */

/* The default as docs/gateway.md's reference writes it. */
static void default_shown(const struct conf_key *row, char *out, size_t cap)
{
    size_t i, used;

    out[0] = '\0';
    if ((row->flags & KEY_REQUIRED) != 0) {
        snprintf(out, cap, "required");
    } else if (row->doc != NULL) {
        snprintf(out, cap, "%s", row->doc);
    } else if (row->def_list != NULL) {
        snprintf(out, cap, "[");
        for (i = 0; row->def_list[i] != NULL; i++) {
            used = strlen(out);
            snprintf(out + used, cap - used, "%s%s", i ? ", " : "", row->def_list[i]);
        }
        used = strlen(out);
        snprintf(out + used, cap - used, "]");
    } else if (row->def_text != NULL) {
        snprintf(out, cap, "%s", row->def_text);
    } else if (row->type == KEY_BOOL) {
        snprintf(out, cap, "%s", row->def ? "true" : "false");
    } else if (row->type == KEY_INT) {
        snprintf(out, cap, "%lld", (long long)row->def);
    } else if (row->type == KEY_DURATION) {
        fmt_duration(row->def, out, cap);
    } else if (row->type == KEY_SIZE) {
        fmt_size(row->def, out, cap);
    }
}

static void list_keys(const struct conf_section *sec, const char *prefix, struct gw_config_key *out,
                      size_t cap, size_t *n)
{
    static const char *const types[] = {"bool", "integer", "duration", "size",
                                        "text", "word",    "section",  "custom"};
    const struct conf_key *row;
    struct gw_config_key *k;
    char path[sizeof out->path];
    size_t i;

    for (i = 0; i < sec->nkeys; i++) {
        row = &sec->keys[i];
        snprintf(path, sizeof path, "%s%s%s%s", prefix, prefix[0] ? "." : "", row->name,
                 (row->flags & KEY_LIST)   ? "[]"
                 : (row->flags & KEY_OPEN) ? ".*"
                                           : "");
        if (row->type != KEY_SECTION && (row->flags & KEY_LIST) == 0) {
            if (*n < cap) {
                k = &out[*n];
                memset(k, 0, sizeof *k);
                memcpy(k->path, path, sizeof path);
                k->type = types[row->type];
                default_shown(row, k->def, sizeof k->def);
                k->bounded =
                    row->type == KEY_INT || row->type == KEY_DURATION || row->type == KEY_SIZE;
                k->min = row->min;
                k->max = row->max;
                k->has_value = (row->type <= KEY_SIZE) && (row->flags & KEY_DERIVED) == 0;
                k->def_value = row->def;
                k->field_size = row->size;
            }
            (*n)++;
        }
        if (row->sub != NULL && (row->flags & KEY_FORM) == 0)
            list_keys(row->sub, path, out, cap, n);
    }
}

size_t gw_config_keys(struct gw_config_key *out, size_t cap)
{
    size_t n = 0;

    list_keys(&top_section, "", out, cap, &n);
    return n;
}
