/* SPDX-License-Identifier: Apache-2.0 */
/*
 * route.c - matching a request to a configured route (route.h).
 *
 * The gateway must key every request the upstream will run as a keyed route's handler, and the
 * upstream's router is more lenient than an exact comparison: Express and ASP.NET Core ignore
 * case and a trailing '/', Tomcat (Spring) drops ";params" and resolves dot segments, Werkzeug
 * (Flask) and WSGI servers decode %2F before splitting the path, Rails ignores a ".json" format
 * suffix, most merge "//".  A request that one of them would route to a keyed handler and the
 * gateway passed through unkeyed would run twice on a retry.  So the path is read in each of those
 * ways (a "view"), and a route matches when one view of the path fits its template:
 *
 *   every view     percent-decoded per segment (%2e is '.'), empty segments dropped ("//" and a
 *                  trailing '/'), "." dropped and ".." taking the segment before it away;
 *                  literal segments compared ignoring ASCII case unless the route is
 *                  case_sensitive
 *   VIEW_LENIENT   also ";params" cut from every segment and a ".format" suffix from the last
 *   VIEW_DECODED   '/' decoded from %2F separates segments too
 *
 * The views are tried in order (exact reading first), routes in file order within each: the first
 * fit wins, and its path values are that view's segments.  What is forwarded is the request as
 * sent; only the decision "keyed or not" and the path values come from here.
 *
 * A gateway has tens of routes, not thousands: a walk over them costs less than building anything
 * cleverer, and it runs once per request on the event loop.
 */
#include "route.h"

#include <stdlib.h>
#include <string.h>

#include "ascii.h"
#include "util.h"
#include "banned.h"

#define VIEW_LENIENT 1 /* ";params" dropped, a ".format" suffix dropped from the last segment */
#define VIEW_DECODED 2 /* %2F splits segments as '/' does */

/* Longest format suffix (".json", ".xml", ".csv") a lenient view drops from the last segment. */
#define FORMAT_SUFFIX_MAX 8

/* A path read one way: its segments, NUL-terminated in `buf`. */
/* Paths up to this long are read in the view's own storage: no allocation per request. */
#define VIEW_STACK_BYTES 512

struct path_view {
    char *buf;
    const char **seg;
    size_t nseg;
    char small_buf[VIEW_STACK_BYTES + 1];
    const char *small_seg[VIEW_STACK_BYTES / 2 + 1];
};

/*
 * The value of the escape "%XX" at s[i] (i < len), or -1 when there is none there: "%00" and a '%'
 * that starts no escape are kept as they are.
 */
static int escape_at(const char *s, size_t len, size_t i)
{
    int hi, lo;

    if (s[i] != '%' || i + 2 >= len || (hi = hex_value(s[i + 1])) < 0 ||
        (lo = hex_value(s[i + 2])) < 0 || (hi | lo) == 0)
        return -1;
    return hi * 16 + lo;
}

/* Decodes [s, s+len) into `out` (which may be `s`); returns the decoded length. */
static size_t decode(const char *s, size_t len, char *out)
{
    size_t i, o = 0;

    for (i = 0; i < len; i++) {
        int c = escape_at(s, len, i);
        if (c >= 0) {
            out[o++] = (char)c;
            i += 2;
        } else {
            out[o++] = s[i];
        }
    }
    return o;
}

/*
 * The segment of `len` bytes just written at v->buf + *at is complete: a dot segment is resolved,
 * an empty one dropped, any other kept.
 */
static void view_push(struct path_view *v, size_t len, size_t *at)
{
    char *seg = v->buf + *at;

    seg[len] = '\0';
    if (len == 0 || strcmp(seg, ".") == 0)
        return;
    if (strcmp(seg, "..") == 0) {
        if (v->nseg > 0)
            v->nseg--;
        return;
    }
    v->seg[v->nseg++] = seg;
    *at += len + 1;
}

/* Drops a ".format" suffix (letters and digits) from the last segment, keeping a non-empty name. */
static void drop_format_suffix(struct path_view *v)
{
    char *last, *dot;
    size_t n;

    if (v->nseg == 0)
        return;
    last = (char *)v->seg[v->nseg - 1];
    dot = strrchr(last, '.');
    if (dot == NULL || dot == last)
        return;
    n = strlen(dot + 1);
    if (n == 0 || n > FORMAT_SUFFIX_MAX)
        return;
    for (size_t i = 1; i <= n; i++) {
        char c = dot[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return;
    }
    *dot = '\0';
}

/*
 * Reads `path` (len bytes, as sent: percent-encoded) the way `how` says.  Segments are non-empty
 * and each but the first follows a '/', so len + 1 bytes hold them with their NULs.
 */
static void view_build(const char *path, size_t len, int how, struct path_view *v)
{
    char *decoded = NULL;
    const char *s = path;
    size_t at = 0, i = 0;

    if (len <= VIEW_STACK_BYTES) {
        v->buf = v->small_buf;
        v->seg = v->small_seg;
    } else {
        v->buf = xmalloc(len + 1);
        v->seg = xcalloc(len / 2 + 1, sizeof *v->seg);
    }
    v->nseg = 0;
    if (how & VIEW_DECODED) {
        decoded = xmalloc(len + 1);
        len = decode(path, len, decoded);
        s = decoded;
    }
    while (i <= len) {
        const char *slash = i < len ? memchr(s + i, '/', len - i) : NULL;
        size_t end = slash ? (size_t)(slash - s) : len;
        /* ";params" are cut before decoding: an encoded ';' (%3B) is data, as Tomcat reads it. */
        const char *semi = (how & VIEW_LENIENT) ? memchr(s + i, ';', end - i) : NULL;
        size_t piece = semi ? (size_t)(semi - (s + i)) : end - i;

        if (how & VIEW_DECODED) {
            memcpy(v->buf + at, s + i, piece);
            view_push(v, piece, &at);
        } else {
            view_push(v, decode(s + i, piece, v->buf + at), &at);
        }
        i = end + 1;
    }
    if (how & VIEW_LENIENT)
        drop_format_suffix(v);
    free(decoded);
}

static void view_release(struct path_view *v)
{
    if (v->buf != v->small_buf) {
        free(v->buf);
        free(v->seg);
    }
}

/*
 * Whether the path segment `seg` (decoded) is the template's literal segment [t, t+tl) (which may
 * hold escapes too).
 */
static int literal_fits(const char *t, size_t tl, const char *seg, int case_sensitive)
{
    size_t i, k = 0;

    for (i = 0; i < tl; i++, k++) {
        int c = escape_at(t, tl, i);
        if (c >= 0)
            i += 2;
        else
            c = (unsigned char)t[i];
        if (seg[k] == '\0')
            return 0;
        if (case_sensitive ? seg[k] != (char)c : ascii_lower(seg[k]) != ascii_lower((char)c))
            return 0;
    }
    return seg[k] == '\0';
}

/*
 * Whether the view `v` fits the template `tpl` ("/v1/orders/{id}"): a {name} segment takes any one
 * segment, whose index goes into params[] (when not NULL).  Returns the number of parameters, or
 * -1.
 */
static int fits(const struct gw_route *r, const struct path_view *v, size_t params[])
{
    const char *t = r->path;
    size_t k = 0;
    int n = 0;

    while (*t == '/') {
        size_t tl;
        t++;
        tl = strcspn(t, "/");
        if (tl == 0) /* the root template "/" */
            break;
        if (k == v->nseg)
            return -1;
        if (t[0] == '{') {
            if (n == ROUTE_MAX_PARAMS)
                return -1;
            if (params)
                params[n] = k;
            n++;
        } else if (!literal_fits(t, tl, v->seg[k], r->case_sensitive)) {
            return -1;
        }
        k++;
        t += tl;
    }
    return k == v->nseg ? n : -1;
}

/* Whether any route is for `method`. */
static int method_routed(const struct gw_config *cfg, const char *method)
{
    for (size_t i = 0; i < cfg->nroutes; i++)
        if (strcmp(cfg->routes[i].method, method) == 0)
            return 1;
    return 0;
}

int route_find(const struct gw_config *cfg, const char *method, const char *target,
               struct route_match *m)
{
    size_t len = strcspn(target, "?#");
    int lenient = memchr(target, ';', len) != NULL || memchr(target, '.', len) != NULL;
    int encoded_slash = 0;

    memset(m, 0, sizeof *m);
    if (!method_routed(cfg, method))
        return 0; /* most requests passed through: no path is read at all */
    for (size_t i = 0; i + 2 < len; i++)
        if (target[i] == '%' && target[i + 1] == '2' && ascii_lower(target[i + 2]) == 'f')
            encoded_slash = 1;
    for (int how = 0; how <= (VIEW_LENIENT | VIEW_DECODED); how++) {
        struct path_view v;
        if (((how & VIEW_LENIENT) && !lenient) || ((how & VIEW_DECODED) && !encoded_slash))
            continue; /* this view reads the path no differently */
        view_build(target, len, how, &v);
        for (size_t i = 0; i < cfg->nroutes; i++) {
            const struct gw_route *r = &cfg->routes[i];
            size_t params[ROUTE_MAX_PARAMS];
            int n;
            if (strcmp(r->method, method) != 0)
                continue;
            n = fits(r, &v, params);
            if (n < 0)
                continue;
            m->route = r;
            m->nparams = (size_t)n;
            if (n > 0) { /* the values, in a block of their own that outlives the view */
                m->buf = xmalloc(len + 1);
                memcpy(m->buf, v.buf, len + 1);
                for (int k = 0; k < n; k++)
                    m->params[k] = m->buf + (v.seg[params[k]] - v.buf);
            }
            view_release(&v);
            return 1;
        }
        view_release(&v);
    }
    return 0;
}

void route_match_clear(struct route_match *m)
{
    free(m->buf);
    memset(m, 0, sizeof *m);
}
