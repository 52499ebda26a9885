/*
 * route.c - matching a request to a configured route (route.h).  A gateway has tens of routes,
 * not thousands: a walk over them, segment by segment, costs less than building anything
 * cleverer, and it runs once per request on the event loop.
 */
#include "route.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "banned.h"

/* The length of the segment starting at `s` (up to the next '/' or the end). */
static size_t seg_len(const char *s)
{
    const char *e = strchr(s, '/');
    return e ? (size_t)(e - s) : strlen(s);
}

/*
 * Walks `tpl` and `path` together; each {name} segment of `tpl` matches one non-empty segment of
 * `path`, whose offset and length go into `offs` (when not NULL).  Returns the number of
 * parameters, or -1 when the path does not fit the template.
 */
static int match_template(const char *tpl, const char *path, size_t offs[][2])
{
    const char *t = tpl, *p = path;
    int n = 0;

    if (*t != '/' || *p != '/')
        return -1;
    for (;;) {
        size_t tl, pl;
        t++;
        p++;
        tl = seg_len(t);
        pl = seg_len(p);
        if (tl >= 2 && t[0] == '{' && t[tl - 1] == '}') {
            if (pl == 0 || n == ROUTE_MAX_PARAMS)
                return -1;
            if (offs) {
                offs[n][0] = (size_t)(p - path);
                offs[n][1] = pl;
            }
            n++;
        } else if (tl != pl || memcmp(t, p, tl) != 0) {
            return -1;
        }
        t += tl;
        p += pl;
        if (*t == '\0' || *p == '\0')
            return *t == *p ? n : -1;
    }
}

int route_find(const struct gw_config *cfg, const char *method, const char *path,
               struct route_match *m)
{
    size_t offs[ROUTE_MAX_PARAMS][2];

    memset(m, 0, sizeof *m);
    for (size_t i = 0; i < cfg->nroutes; i++) {
        const struct gw_route *r = &cfg->routes[i];
        int n;
        if (strcmp(r->method, method) != 0)
            continue;
        n = match_template(r->path, path, offs);
        if (n < 0)
            continue;
        m->route = r;
        m->nparams = (size_t)n;
        if (n > 0) {
            /* One block, each value NUL-terminated: the path's bytes with NULs in place of '/'. */
            m->buf = xstrdup(path);
            for (int k = 0; k < n; k++) {
                m->buf[offs[k][0] + offs[k][1]] = '\0';
                m->params[k] = m->buf + offs[k][0];
            }
        }
        return 1;
    }
    return 0;
}

void route_match_clear(struct route_match *m)
{
    free(m->buf);
    memset(m, 0, sizeof *m);
}
