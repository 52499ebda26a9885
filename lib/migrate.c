/* SPDX-License-Identifier: Apache-2.0 */
/*
 * migrate.c - the one migration driver both stores run: libidem's own schema when a store opens
 * a connection, and an application's steps (idem_store_migrate).
 *
 * A component's steps apply in order, each in a transaction of its own that first serialises
 * every migrating process (the store's migrate_begin: SQLite's write lock, PostgreSQL's advisory
 * lock) and then reads the component's version again under that lock.  So processes that start
 * at once apply each step exactly once: the one that waited finds the step done and skips it.  A
 * step that fails rolls back whole and stops the run, with the component, the step and the
 * store's words in the message.  The stores give the dialect: how to lock, read and record a
 * version, and which of a step's two texts is theirs.
 */
#include "internal.h"

#include <string.h>

/* The step's text in the dialect of this store, and the dialect's name for a message. */
static const char *step_sql(const struct idem_store_methods *m, const struct idem_migration *step,
                            const char **dialect)
{
    int sqlite = strcmp(m->kind, "sqlite") == 0;

    *dialect = sqlite ? "SQLite" : "PostgreSQL";
    return sqlite ? step->sqlite_sql : step->postgres_sql;
}

int idem__migrate(const struct idem_store_methods *m, struct idem_conn *c, const char *component,
                  const struct idem_migration *steps, size_t n, int *applied, char *err,
                  size_t errlen)
{
    const struct idem_conn_methods *cm = m->conn;
    int count = 0, version = 0;
    int rc = cm->schema_version(c, component, &version); /* outside a transaction: no lock */

    if (rc < 0)
        idem__fmt(err, errlen, "%s: %s", component, cm->errmsg(c));
    for (size_t i = 0; rc == 0 && i < n && version < steps[n - 1].version; i++) {
        const char *dialect = "", *sql = step_sql(m, &steps[i], &dialect);

        rc = cm->migrate_begin(c);
        if (rc == 0)
            rc = cm->schema_version(c, component, &version);
        if (rc == 0 && version >= steps[i].version) {
            cm->rollback(c); /* done already, by this process earlier or by another */
            continue;
        }
        if (rc == 0 && !sql) {
            idem__fmt(err, errlen, "migration %s %d has no %s form", component, steps[i].version,
                      dialect);
            cm->rollback(c);
            rc = IDEM_EMIGRATE;
            break;
        }
        if (rc == 0)
            rc = cm->run_script(c, sql);
        if (rc == 0)
            rc = cm->schema_set(c, component, steps[i].version);
        if (rc == 0)
            rc = cm->commit(c);
        if (rc < 0) {
            idem__fmt(err, errlen, "%s %d (%s): %s", component, steps[i].version,
                      steps[i].name ? steps[i].name : "", cm->errmsg(c));
            cm->rollback(c);
            rc = IDEM_EMIGRATE;
            break;
        }
        version = steps[i].version;
        count++;
    }
    if (applied)
        *applied = count;
    return rc;
}
