/* SPDX-License-Identifier: Apache-2.0 */
/*
 * jcs.c - RFC 8785 JSON Canonicalization Scheme.  Two requests mean the same thing when their
 * bodies are the same JSON value, whatever the member order, white space, escapes or number
 * spelling ("1E2" and "100.0").  The request fingerprint must see only the value, so it hashes
 * the one canonical text JCS defines for it: members sorted by the UTF-16 code units of their
 * names, strings with minimal escaping, numbers as ECMAScript prints an IEEE 754 double.
 *
 * jansson parses (every number as a double, duplicates refused, U+0000 allowed in strings); this
 * file walks the tree with its own depth limit and writes the canonical text into a capped
 * buffer, because the body comes from a stranger.
 */
#include "internal.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capped_buf.h"

/* Neither the body nor its canonical form may exceed this; bodies are a few MiB at most. */
#define JCS_MAX_BYTES ((size_t)16 * 1024 * 1024)

/* 2^53: below it every integer is a double and prints as itself (RFC 8785 §3.2.2.3). */
#define JCS_EXACT_INT 9007199254740992.0

/* A growable output buffer with a hard cap (curl's dynbuf). */
/* One member of an object, gathered so the members can be sorted before they are written. */
struct jcs_member {
    const char *name;
    size_t name_len;
    json_t *value;
};

/* Appends n bytes of the canonical text: IDEM_ETOOBIG past JCS_MAX_BYTES, or IDEM_ENOMEM. */
static int buf_add(struct capped_buf *b, const char *s, size_t n)
{
    int rc = capped_buf_add(b, s, n);

    return rc == 0 ? 0 : rc == CAPPED_BUF_TOO_BIG ? IDEM_ETOOBIG : IDEM_ENOMEM;
}

/* ---- numbers -------------------------------------------------------------------------------- */

/* Whether the decimal m * 10^e reads back (correctly rounded by strtod) as exactly v. */
static int reads_back(unsigned long long m, int e, double v)
{
    char tmp[48];

    /* An integer mantissa has no decimal point, so the current locale cannot get in the way. */
    snprintf(tmp, sizeof tmp, "%llue%d", m, e);
    return strtod(tmp, NULL) == v;
}

/*
 * Whether v rounded to p digits (exactly, by printf: correct rounding, ties to even, which is
 * also ECMAScript's rule) is the lower candidate m * 10^(x - p + 1) rather than the one above.
 * Only needed to break a near-tie that 17 digits cannot see.  A carry ("9.5" to "1e+01") moves
 * the exponent, and then the rounding went up.
 */
static int rounds_down(double v, int p, unsigned long long m, int x)
{
    char tmp[64];
    const char *q;
    unsigned long long r = 0;
    int xr;

    snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
    /* Skip whatever the locale uses as the decimal point: only the digits matter. */
    for (q = tmp; *q && *q != 'e'; q++) {
        if (*q >= '0' && *q <= '9')
            r = r * 10 + (unsigned long long)(*q - '0');
    }
    xr = *q == 'e' ? (int)strtol(q + 1, NULL, 10) : 0;
    return xr == x && r == m;
}

/* v rounded to 17 significant digits: d[0].d[1]...d[16] * 10^x.  17 digits always read back. */
struct jcs_digits {
    double v;
    char d[17];
    int x;
};

/*
 * Whether some decimal of p significant digits reads back as v; if so stores the nearest such
 * as m * 10^e.  Only the two p-digit decimals around v can read back, the 17-digit prefix
 * truncated to p digits and the one above it; both must be tried, because near a power of two
 * the interval of decimals that round to v is lopsided.  If the 17 digits end in zeros after p,
 * the prefix is v's correctly rounded 17-digit form itself and reads back.
 */
static int fits(const struct jcs_digits *dg, int p, unsigned long long *mout, int *eout)
{
    unsigned long long m = 0;
    int i, e = dg->x - (p - 1), lo, hi, tail = 0, ok = 1;

    for (i = 0; i < p; i++)
        m = m * 10 + (unsigned long long)(dg->d[i] - '0');
    /* tail: where the digits after p stand against one half (-1 below, 0 equal, 1 above) */
    for (i = p; i < 17 && tail == 0; i++) {
        if (dg->d[i] != (i == p ? '5' : '0'))
            tail = dg->d[i] > (i == p ? '5' : '0') ? 1 : -1;
    }
    for (i = p; i < 17 && dg->d[i] == '0'; i++)
        ;
    if (i == 17)
        goto out; /* nothing after the prefix: it is v's 17-digit form */
    lo = reads_back(m, e, dg->v);
    hi = reads_back(m + 1, e, dg->v);
    if (lo && hi) {
        /* Both fit: the nearer wins, and an exact half at 17 digits needs v's own digits. */
        if (tail > 0 || (tail == 0 && !rounds_down(dg->v, p, m, dg->x)))
            m++;
    } else if (hi) {
        m++;
    } else if (!lo) {
        ok = 0;
    }
out:
    if (ok) {
        *mout = m;
        *eout = e;
    }
    return ok;
}

/*
 * The shortest decimal m * 10^e that reads back as v (finite, > 0), nearest to v among those of
 * that length, as ECMAScript's Number::toString wants it.  A p-digit decimal is also a
 * (p+1)-digit one, so "some p-digit decimal fits" is monotonic in p and a search finds the
 * fewest digits.  Most numbers people send ("19.99") fit in 15 digits, and then the 15-digit
 * decimal without its trailing zeros is usually the answer, which one failing probe confirms;
 * a body full of numbers must stay cheap to canonicalise.
 */
static void shortest(double v, unsigned long long *mout, int *eout)
{
    struct jcs_digits dg;
    char tmp[64];
    const char *q;
    unsigned long long m;
    int n = 0, lo = 1, hi = 17, mid, e, best = 0;

    dg.v = v;
    snprintf(tmp, sizeof tmp, "%.16e", v);
    for (q = tmp; *q && *q != 'e'; q++) {
        if (*q >= '0' && *q <= '9' && n < 17)
            dg.d[n++] = *q;
    }
    while (n < 17)
        dg.d[n++] = '0';
    dg.x = *q == 'e' ? (int)strtol(q + 1, NULL, 10) : 0;

    if (fits(&dg, 15, &m, &e)) {
        /* Without its trailing zeros it is the same decimal: the shortest has at most hi digits. */
        for (hi = 15; hi > 1 && m % 10 == 0; hi--)
            m /= 10;
        best = hi;
        *mout = m;
        *eout = e + (15 - hi);
        if (hi > 1 && fits(&dg, hi - 1, mout, eout))
            best = --hi;
        else
            lo = hi;
    } else {
        lo = 16;
    }
    while (lo < hi) {
        mid = lo + (hi - lo) / 2;
        if (fits(&dg, mid, mout, eout)) {
            hi = mid;
            best = mid;
        } else {
            lo = mid + 1;
        }
    }
    /* *mout holds the last successful probe; if that was longer than `lo`, probe `lo` again. */
    if (best != lo)
        (void)fits(&dg, lo, mout, eout);
}

/*
 * Writes v as ECMAScript's Number.prototype.toString does (ECMA-262 §6.1.6.1.20, the steps
 * RFC 8785 §3.2.2.3 adopts).  Returns the length, or -1 for NaN and the infinities, which JSON
 * cannot carry.  `dst` needs 32 bytes: the longest form, "-0.0000012345678901234567", has 25.
 */
static int format_number(double v, char *dst, size_t cap)
{
    char digits[32];
    unsigned long long m;
    int len = -1, k, n, e, i, pos = 0;
    long long iv;

    if (v != v || v > 1.7976931348623157e308 || v < -1.7976931348623157e308)
        goto out;
    /* Integers below 2^53 are exact and their shortest form is themselves; -0 prints as "0". */
    if (v > -JCS_EXACT_INT && v < JCS_EXACT_INT) {
        iv = (long long)v;
        if ((double)iv == v) {
            len = snprintf(dst, cap, "%lld", iv);
            goto out;
        }
    }
    if (v < 0) {
        dst[pos++] = '-';
        v = -v;
    }
    shortest(v, &m, &e);
    k = snprintf(digits, sizeof digits, "%llu", m);
    n = e + k; /* v = 0.digits * 10^n, the "n" of the ECMAScript algorithm */
    while (k > 1 && digits[k - 1] == '0')
        k--;
    digits[k] = '\0';

    if (k <= n && n <= 21) {
        /* An integer of up to 21 digits: the digits, then zeros. */
        pos += snprintf(dst + pos, cap - (size_t)pos, "%s", digits);
        for (i = 0; i < n - k; i++)
            dst[pos++] = '0';
    } else if (0 < n && n <= 21) {
        /* The decimal point falls inside the digits. */
        memcpy(dst + pos, digits, (size_t)n);
        pos += n;
        dst[pos++] = '.';
        memcpy(dst + pos, digits + n, (size_t)(k - n));
        pos += k - n;
    } else if (-6 < n && n <= 0) {
        /* Down to 1e-6 a plain "0.000001"; 1e-7 and smaller take an exponent (below). */
        dst[pos++] = '0';
        dst[pos++] = '.';
        for (i = 0; i < -n; i++)
            dst[pos++] = '0';
        memcpy(dst + pos, digits, (size_t)k);
        pos += k;
    } else {
        /* Everything else in exponent form, the sign of the exponent always written. */
        dst[pos++] = digits[0];
        if (k > 1) {
            dst[pos++] = '.';
            memcpy(dst + pos, digits + 1, (size_t)(k - 1));
            pos += k - 1;
        }
        pos += snprintf(dst + pos, cap - (size_t)pos, "e%c%d", n - 1 < 0 ? '-' : '+',
                        n - 1 < 0 ? 1 - n : n - 1);
    }
    dst[pos] = '\0';
    len = pos;
out:
    return len;
}

/* ---- strings -------------------------------------------------------------------------------- */

/* RFC 8785 §3.2.2.2: escape only what JSON requires, with the short forms where they exist. */
static int put_string(struct capped_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    int rc;
    size_t i, run = 0;
    char esc[8];
    size_t elen;
    unsigned char c;

    rc = buf_add(b, "\"", 1);
    if (rc < 0)
        goto out;
    for (i = 0; i < n; i++) {
        c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        /* Flush the run of bytes that are written as they are (UTF-8 included). */
        rc = buf_add(b, s + run, i - run);
        if (rc < 0)
            goto out;
        run = i + 1;
        esc[0] = '\\';
        elen = 2;
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 0xf];
            elen = 6;
            break;
        }
        rc = buf_add(b, esc, elen);
        if (rc < 0)
            goto out;
    }
    rc = buf_add(b, s + run, n - run);
    if (rc < 0)
        goto out;
    rc = buf_add(b, "\"", 1);
out:
    return rc;
}

/* ---- member order --------------------------------------------------------------------------- */

/* Decodes the code point at s[*i] (jansson has validated the UTF-8) and moves past it. */
static unsigned long next_code_point(const unsigned char *s, size_t n, size_t *i)
{
    unsigned long cp = s[*i];
    size_t more = 0, j;

    if (cp >= 0xf0) {
        cp &= 0x07;
        more = 3;
    } else if (cp >= 0xe0) {
        cp &= 0x0f;
        more = 2;
    } else if (cp >= 0xc0) {
        cp &= 0x1f;
        more = 1;
    }
    (*i)++;
    for (j = 0; j < more && *i < n; j++, (*i)++)
        cp = (cp << 6) | (s[*i] & 0x3f);
    return cp;
}

/* The first UTF-16 code unit of a code point: itself, or its high surrogate. */
static unsigned long first_unit(unsigned long cp)
{
    return cp < 0x10000 ? cp : 0xd800 + ((cp - 0x10000) >> 10);
}

/*
 * RFC 8785 §3.2.3 orders names by their UTF-16 code units, which is code point order except
 * that characters above U+FFFF (sent as surrogates D800-DFFF) come before U+E000-U+FFFF.
 */
static int compare_members(const void *pa, const void *pb)
{
    const struct jcs_member *a = pa, *b = pb;
    const unsigned char *sa = (const unsigned char *)a->name, *sb = (const unsigned char *)b->name;
    size_t i = 0, j = 0;
    unsigned long ca, cb, ua, ub;
    int order = 0;

    while (order == 0 && i < a->name_len && j < b->name_len) {
        ca = next_code_point(sa, a->name_len, &i);
        cb = next_code_point(sb, b->name_len, &j);
        if (ca == cb)
            continue;
        ua = first_unit(ca);
        ub = first_unit(cb);
        /* Equal high surrogates: the low surrogates then follow code point order. */
        if (ua == ub)
            order = ca < cb ? -1 : 1;
        else
            order = ua < ub ? -1 : 1;
    }
    /* A name that is a prefix of the other comes first. */
    if (order == 0 && i < a->name_len)
        order = 1;
    else if (order == 0 && j < b->name_len)
        order = -1;
    return order;
}

/* ---- the walk ------------------------------------------------------------------------------- */

static int put_value(struct capped_buf *b, json_t *v, int depth, const char **why);

static int put_object(struct capped_buf *b, json_t *obj, int depth, const char **why)
{
    int rc = 0;
    struct jcs_member *m = NULL;
    size_t n = json_object_size(obj), i = 0, name_len;
    const char *name;
    json_t *value;

    if (n) {
        m = calloc(n, sizeof *m);
        if (!m) {
            rc = IDEM_ENOMEM;
            goto out;
        }
        json_object_keylen_foreach(obj, name, name_len, value)
        {
            if (i < n) {
                m[i].name = name;
                m[i].name_len = name_len;
                m[i].value = value;
                i++;
            }
        }
        n = i;
        qsort(m, n, sizeof *m, compare_members);
    }
    rc = buf_add(b, "{", 1);
    for (i = 0; rc == 0 && i < n; i++) {
        if (i)
            rc = buf_add(b, ",", 1);
        if (rc == 0)
            rc = put_string(b, m[i].name, m[i].name_len);
        if (rc == 0)
            rc = buf_add(b, ":", 1);
        if (rc == 0)
            rc = put_value(b, m[i].value, depth, why);
    }
    if (rc < 0)
        goto out;
    rc = buf_add(b, "}", 1);
out:
    free(m);
    return rc;
}

static int put_array(struct capped_buf *b, json_t *arr, int depth, const char **why)
{
    int rc;
    size_t i, n = json_array_size(arr);

    rc = buf_add(b, "[", 1);
    for (i = 0; rc == 0 && i < n; i++) {
        if (i)
            rc = buf_add(b, ",", 1);
        if (rc == 0)
            rc = put_value(b, json_array_get(arr, i), depth, why);
    }
    if (rc < 0)
        goto out;
    rc = buf_add(b, "]", 1);
out:
    return rc;
}

/*
 * Writes one value.  `depth` counts the arrays and objects around v; the limit is checked before
 * descending, so the recursion is bounded by IDEM_JSON_MAX_DEPTH whatever jansson accepted.
 */
static int put_value(struct capped_buf *b, json_t *v, int depth, const char **why)
{
    int rc = 0, len;
    char num[40];

    switch (json_typeof(v)) {
    case JSON_OBJECT:
    case JSON_ARRAY:
        if (depth >= IDEM_JSON_MAX_DEPTH) {
            rc = IDEM_EDEPTH;
            *why = "JSON is nested more than 64 levels deep";
            goto out;
        }
        if (json_is_object(v))
            rc = put_object(b, v, depth + 1, why);
        else
            rc = put_array(b, v, depth + 1, why);
        break;
    case JSON_STRING:
        rc = put_string(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_REAL:
    case JSON_INTEGER:
        /* JSON_DECODE_INT_AS_REAL makes every number a real; an integer is handled all the same. */
        len = format_number(json_number_value(v), num, sizeof num);
        if (len < 0) {
            rc = IDEM_EJSON;
            *why = "number is not finite as a double";
            goto out;
        }
        rc = buf_add(b, num, (size_t)len);
        break;
    case JSON_TRUE:
        rc = buf_add(b, "true", 4);
        break;
    case JSON_FALSE:
        rc = buf_add(b, "false", 5);
        break;
    case JSON_NULL:
        rc = buf_add(b, "null", 4);
        break;
    }
out:
    return rc;
}

_Static_assert(IDEM_JSON_MAX_DEPTH == 64, "update \"nested more than 64 levels deep\"");

size_t idem_json_nesting(const void *json, size_t len)
{
    const char *p = json;
    size_t depth = 0, max = 0;
    int in_string = 0;

    for (size_t i = 0; p && i < len; i++) {
        char c = p[i];
        if (in_string) {
            if (c == '\\')
                i++; /* the escaped character cannot end the string */
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > max)
                max = depth;
        } else if ((c == '}' || c == ']') && depth > 0) {
            depth--;
        }
    }
    return max;
}

/* Turns jansson's refusal into libidem's code and a sentence that does not point into `err`. */
static int parse_error(const json_error_t *err, const char **why)
{
    int rc = IDEM_EJSON;

    switch (json_error_code(err)) {
    case json_error_duplicate_key:
        rc = IDEM_EDUPKEY;
        *why = "an object names the same member twice";
        break;
    case json_error_stack_overflow:
        rc = IDEM_EDEPTH;
        *why = "JSON is nested more than 64 levels deep";
        break;
    case json_error_out_of_memory:
        rc = IDEM_ENOMEM;
        *why = "out of memory";
        break;
    case json_error_numeric_overflow:
        *why = "number is too large for a double";
        break;
    case json_error_invalid_utf8:
        *why = "body is not valid UTF-8";
        break;
    case json_error_null_byte_in_key:
        *why = "member name contains U+0000, which is not supported";
        break;
    default:
        *why = "body is not valid JSON";
        break;
    }
    return rc;
}

int idem_jcs_canonicalize(const void *json, size_t len, char **out, size_t *out_len,
                          const char **why)
{
    /* Every number a double (RFC 8785 §3.2.2.3), and a repeated name refused, not resolved. */
    const size_t flags =
        JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL;
    int rc = 0;
    const char *reason = NULL;
    json_t *root = NULL;
    json_error_t err;
    struct capped_buf b = {.limit = JCS_MAX_BYTES};

    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!out || (!json && len)) {
        rc = IDEM_EINVAL;
        reason = "NULL argument";
        goto out;
    }
    if (len > JCS_MAX_BYTES) {
        rc = IDEM_ETOOBIG;
        reason = "JSON text is larger than 16 MiB";
        goto out;
    }
    /* Refused before jansson recurses into it: a deep body must not spend a worker's stack. */
    if (idem_json_nesting(json, len) > IDEM_JSON_MAX_DEPTH) {
        rc = IDEM_EDEPTH;
        reason = "JSON is nested more than 64 levels deep";
        goto out;
    }
    root = json_loadb(json ? json : "", len, flags, &err);
    if (!root) {
        rc = parse_error(&err, &reason);
        goto out;
    }
    rc = put_value(&b, root, 0, &reason);
    if (rc == IDEM_ETOOBIG)
        reason = "canonical JSON would be larger than 16 MiB";
    else if (rc == IDEM_ENOMEM)
        reason = "out of memory";
    if (rc < 0)
        goto out;
    *out = b.data;
    if (out_len)
        *out_len = b.len;
    b.data = NULL;
out:
    json_decref(root);
    free(b.data);
    if (why)
        *why = rc < 0 ? reason : NULL;
    return rc;
}
