/* SPDX-License-Identifier: Apache-2.0 */
/*
 * key.c - parsing of the Idempotency-Key header field.  The key comes from a stranger and ends up
 * in a database primary key, in logs and in error messages, so it is held to a narrow shape: an
 * RFC 8941 sf-string or a bare token of visible ASCII, 1 to IDEM_KEY_MAX characters, never a
 * control or non-ASCII byte.  Anything else is refused with a sentence a client developer can act
 * on, instead of being silently "cleaned" into a key the client never sent.
 */
#include "internal.h"

#include <string.h>

#include "key_rule.h"

_Static_assert(IDEM_KEY_MAX == KEY_RULE_MAX, "one length rule for both ends (common/key_rule.h)");

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* Characters allowed inside an sf-string (RFC 8941 §3.3.3): printable ASCII, space included. */
static int is_sf_char(unsigned char c)
{
    return c >= 0x20 && c <= 0x7e;
}

/*
 * Reads the sf-string starting at the opening quote s[0].  The key is counted in full even past
 * IDEM_KEY_MAX so that a malformed long value is reported as malformed, not as too long; only
 * the first IDEM_KEY_MAX characters are stored.
 */
static int parse_quoted(const char *s, size_t len, char *out, size_t *outn, const char **why)
{
    int rc = IDEM_EKEY;
    size_t i = 1, n = 0;
    unsigned char c;

    for (;;) {
        if (i >= len) {
            *why = "unterminated quoted string";
            goto out;
        }
        c = (unsigned char)s[i++];
        if (c == '"')
            break;
        if (c == '\\') {
            if (i >= len) {
                *why = "unterminated quoted string";
                goto out;
            }
            c = (unsigned char)s[i++];
            /* RFC 8941 knows only these two escapes; "\n" or "\u" would be guesses. */
            if (c != '"' && c != '\\') {
                *why = "bad escape in quoted string";
                goto out;
            }
        } else if (!is_sf_char(c)) {
            *why = "key contains a control or non-ASCII character";
            goto out;
        }
        if (n < IDEM_KEY_MAX)
            out[n] = (char)c;
        n++;
    }
    if (i < len) {
        /* The caller trimmed trailing white space, so anything left is a second item or junk. */
        while (i < len && is_ows(s[i]))
            i++;
        *why = (i < len && s[i] == ',') ? "key contains a comma (two keys?)"
                                        : "text after the closing quote";
        goto out;
    }
    *outn = n;
    rc = 0;
out:
    return rc;
}

static int parse_token(const char *s, size_t len, char *out, size_t *outn, const char **why)
{
    int rc = IDEM_EKEY;
    size_t i;
    unsigned char c;

    for (i = 0; i < len; i++) {
        c = (unsigned char)s[i];
        if (c == ',') {
            *why = "key contains a comma (two keys?)";
            goto out;
        }
        if (c == ' ' || c == '\t') {
            *why = "key contains white space (quote it as \"...\")";
            goto out;
        }
        if (c < 0x21 || c > 0x7e) {
            *why = "key contains a control or non-ASCII character";
            goto out;
        }
        if (i < IDEM_KEY_MAX)
            out[i] = (char)c;
    }
    *outn = len;
    rc = 0;
out:
    return rc;
}

int idem_key_parse(const char *value, size_t len, char out[IDEM_KEY_MAX + 1], const char **why)
{
    int rc = IDEM_EKEY;
    const char *reason = NULL;
    size_t start = 0, end = len, n = 0;

    if (!value || !out) {
        rc = IDEM_EINVAL;
        reason = "NULL argument";
        goto out;
    }
    out[0] = '\0';
    while (start < end && is_ows(value[start]))
        start++;
    while (end > start && is_ows(value[end - 1]))
        end--;
    if (start == end) {
        reason = "key is empty";
        goto out;
    }
    if (value[start] == '"')
        rc = parse_quoted(value + start, end - start, out, &n, &reason);
    else
        rc = parse_token(value + start, end - start, out, &n, &reason);
    if (rc < 0)
        goto out;
    rc = IDEM_EKEY;
    reason = key_length_problem(n);
    if (reason != NULL)
        goto out;
    out[n] = '\0';
    rc = 0;
out:
    /* A refused key leaves no partial copy behind for a careless caller to use. */
    if (rc < 0 && out)
        out[0] = '\0';
    if (why)
        *why = rc < 0 ? reason : NULL;
    return rc;
}
