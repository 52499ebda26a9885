/*
 * db.c - thin helpers over libidem's store calls (see db.h).  Opening creates the directory of
 * an SQLite file, so `orderd serve` works on a fresh checkout; values come back as text from
 * every store, so the conversions live here once.
 */
#include "db.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "idem/idem.h"

#include "app.h"
#include "log.h"
#include "util.h"
#include "banned.h"

/* mkdir -p of the directory part of `path`. */
static int make_parent_dirs(const char *path, char *err, size_t errlen)
{
    char *dir = xstrdup(path);
    char *slash = strrchr(dir, '/');
    char *p;
    char saved;
    int rc = 0;

    if (slash == NULL || slash == dir)
        goto out;
    *slash = '\0';
    for (p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        saved = *p;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "cannot create directory %s: %s", dir, strerror(errno));
            rc = IDEM_EINVAL;
            goto out;
        }
        *p = saved;
        if (saved == '\0')
            break;
    }
out:
    free(dir);
    return rc;
}

int db_open(const char *uri, int pool, enum idem_sync sync, struct idem_store **out, char *err,
            size_t errlen)
{
    struct idem_store_options opts;
    char *msg = NULL;
    int rc;

    *out = NULL;
    if (strncmp(uri, "sqlite:", 7) == 0 && uri[7] != '\0' && strcmp(uri + 7, ":memory:") != 0) {
        rc = make_parent_dirs(uri + 7, err, errlen);
        if (rc < 0)
            goto out;
    }
    memset(&opts, 0, sizeof opts);
    opts.pool_size = pool;
    opts.sync = sync;
    rc = idem_store_open(uri, &opts, out, &msg);
    if (rc < 0) /* Not the URI: a PostgreSQL one may carry a password. */
        snprintf(err, errlen, "cannot open the store: %s", msg ? msg : idem_strerror(rc));
out:
    idem_free(msg);
    return rc;
}

int db_exec(const struct app *app, struct idem_tx *tx, const char *sql, int nparams,
            const char *const *params, struct idem_rows **rows)
{
    int rc = idem_tx_exec(tx, sql, nparams, params, rows);

    if (rc < 0 && rc != IDEM_ECONFLICT)
        log_msg(&app->log, "error", "SQL failed (%s: %s): %.120s", idem_err_name(rc),
                idem_tx_errmsg(tx) ? idem_tx_errmsg(tx) : "", sql);
    return rc;
}

const char *db_text(const struct idem_rows *rows, int row, int col)
{
    const char *v = idem_rows_get(rows, row, col);

    return v ? v : "";
}

int64_t db_int(const struct idem_rows *rows, int row, int col)
{
    int64_t v = 0;

    if (parse_int64(db_text(rows, row, col), INT64_MIN, INT64_MAX, &v) != 0)
        return 0;
    return v;
}
