/* SPDX-License-Identifier: Apache-2.0 */
/*
 * schema.c - the tables orderd's business logic writes, next to libidem's records in the same
 * store, so one transaction covers both.  Each step is given in both dialects (SQLite today,
 * PostgreSQL next); the SQL the handlers run is written once for both: $n parameters, no
 * AUTOINCREMENT (ids are made by orderd), ON CONFLICT upserts.
 *
 * orders keeps UNIQUE (user_id, idem_key) for good: once an idempotency record has been swept
 * after its retention, the order row is still the long-term dedupe record for a late retry.
 * Steps are append-only: a released step is never edited, a change is a new version.
 */
#include "schema.h"

#include <stddef.h>

#include "idem/idem.h"

#include "banned.h"

/* One text for both dialects; only the integer type differs (PostgreSQL's INTEGER is 32 bits). */
#define BUSINESS_TABLES(INT)                                                                       \
    "CREATE TABLE users ("                                                                         \
    "  id TEXT PRIMARY KEY,"                                                                       \
    "  name TEXT NOT NULL UNIQUE"                                                                  \
    ");"                                                                                           \
    "CREATE TABLE tokens ("                                                                        \
    "  hash TEXT PRIMARY KEY,"                                                                     \
    "  user_id TEXT NOT NULL REFERENCES users (id),"                                               \
    "  created_at TEXT NOT NULL"                                                                   \
    ");"                                                                                           \
    "CREATE INDEX tokens_user ON tokens (user_id);"                                                \
    "CREATE TABLE profiles ("                                                                      \
    "  user_id TEXT PRIMARY KEY REFERENCES users (id),"                                            \
    "  name TEXT NOT NULL,"                                                                        \
    "  email TEXT NOT NULL,"                                                                       \
    "  updated_at TEXT NOT NULL"                                                                   \
    ");"                                                                                           \
    "CREATE TABLE products ("                                                                      \
    "  id TEXT PRIMARY KEY,"                                                                       \
    "  name TEXT NOT NULL,"                                                                        \
    "  unit_price " INT " NOT NULL,"                                                               \
    "  currency TEXT NOT NULL,"                                                                    \
    "  stock " INT " NOT NULL CHECK (stock >= 0)"                                                  \
    ");"                                                                                           \
    "CREATE TABLE orders ("                                                                        \
    "  id TEXT PRIMARY KEY,"                                                                       \
    "  user_id TEXT NOT NULL REFERENCES users (id),"                                               \
    "  product_id TEXT NOT NULL REFERENCES products (id),"                                         \
    "  quantity " INT " NOT NULL,"                                                                 \
    "  unit_price " INT " NOT NULL,"                                                               \
    "  amount " INT " NOT NULL,"                                                                   \
    "  currency TEXT NOT NULL,"                                                                    \
    "  status TEXT NOT NULL,"                                                                      \
    "  idem_key TEXT NOT NULL,"                                                                    \
    "  request_fp TEXT NOT NULL,"                                                                  \
    "  created_at TEXT NOT NULL,"                                                                  \
    "  UNIQUE (user_id, idem_key)"                                                                 \
    ");"                                                                                           \
    "CREATE INDEX orders_user_created ON orders (user_id, created_at DESC, id DESC)"

static const char tables_sqlite[] = BUSINESS_TABLES("INTEGER");
static const char tables_postgres[] = BUSINESS_TABLES("BIGINT");

/*
 * Payments (docs/orderd.md): the order's payment columns, the payment and refund rows, the
 * outbox of emails and the inbox of provider webhooks.  *_ms columns are milliseconds since the
 * epoch (BIGINT in both dialects).  payment_check_ms / check_ms are set while an outcome is
 * unknown: when the reconciler should ask the provider next.
 */
#define PAYMENT_TABLES(INT)                                                                        \
    "ALTER TABLE orders ADD COLUMN payment_source TEXT;"                                           \
    "ALTER TABLE orders ADD COLUMN charge_id TEXT;"                                                \
    "ALTER TABLE orders ADD COLUMN refund_status TEXT;"                                            \
    "ALTER TABLE orders ADD COLUMN payment_check_ms BIGINT;"                                       \
    "ALTER TABLE orders ADD COLUMN payment_checks " INT " NOT NULL DEFAULT 0;"                     \
    "CREATE INDEX orders_payment_check ON orders (payment_check_ms);"                              \
    "CREATE TABLE payments ("                                                                      \
    "  order_id TEXT PRIMARY KEY REFERENCES orders (id),"                                          \
    "  charge_id TEXT NOT NULL,"                                                                   \
    "  provider_key TEXT NOT NULL UNIQUE,"                                                         \
    "  amount " INT " NOT NULL,"                                                                   \
    "  currency TEXT NOT NULL,"                                                                    \
    "  status TEXT NOT NULL,"                                                                      \
    "  created_at TEXT NOT NULL"                                                                   \
    ");"                                                                                           \
    "CREATE TABLE refunds ("                                                                       \
    "  order_id TEXT PRIMARY KEY REFERENCES orders (id),"                                          \
    "  provider_key TEXT NOT NULL UNIQUE,"                                                         \
    "  charge_id TEXT NOT NULL,"                                                                   \
    "  amount " INT " NOT NULL,"                                                                   \
    "  currency TEXT NOT NULL,"                                                                    \
    "  status TEXT NOT NULL,"                                                                      \
    "  refund_id TEXT,"                                                                            \
    "  detail TEXT,"                                                                               \
    "  check_ms BIGINT,"                                                                           \
    "  checks " INT " NOT NULL DEFAULT 0,"                                                         \
    "  flag_principal TEXT,"                                                                       \
    "  flag_key TEXT,"                                                                             \
    "  requested_at TEXT NOT NULL,"                                                                \
    "  updated_at TEXT NOT NULL"                                                                   \
    ");"                                                                                           \
    "CREATE INDEX refunds_check ON refunds (check_ms);"                                            \
    "CREATE TABLE outbox ("                                                                        \
    "  id TEXT PRIMARY KEY,"                                                                       \
    "  kind TEXT NOT NULL,"                                                                        \
    "  dedupe_key TEXT NOT NULL UNIQUE,"                                                           \
    "  recipient TEXT NOT NULL,"                                                                   \
    "  payload TEXT NOT NULL,"                                                                     \
    "  status TEXT NOT NULL,"                                                                      \
    "  attempts " INT " NOT NULL DEFAULT 0,"                                                       \
    "  next_attempt_ms BIGINT NOT NULL,"                                                           \
    "  last_error TEXT,"                                                                           \
    "  provider_id TEXT,"                                                                          \
    "  created_at TEXT NOT NULL,"                                                                  \
    "  sent_at TEXT"                                                                               \
    ");"                                                                                           \
    "CREATE INDEX outbox_due ON outbox (status, next_attempt_ms);"                                 \
    "CREATE TABLE inbox ("                                                                         \
    "  event_id TEXT PRIMARY KEY,"                                                                 \
    "  type TEXT NOT NULL,"                                                                        \
    "  result TEXT NOT NULL,"                                                                      \
    "  received_at TEXT NOT NULL"                                                                  \
    ")"

static const char payments_sqlite[] = PAYMENT_TABLES("INTEGER");
static const char payments_postgres[] = PAYMENT_TABLES("BIGINT");

/* The catalog of docs/http-api.md; p-limited exists to run out. */
static const char seed_products[] =
    "INSERT INTO products (id, name, unit_price, currency, stock) VALUES"
    " ('p-1024', 'Product 1024', 1999, 'EUR', 1000000000),"
    " ('p-2048', 'Product 2048', 4999, 'EUR', 1000000000),"
    " ('p-limited', 'Limited edition', 999, 'EUR', 3)";

/*
 * An order's foreign keys (its user, its product) are checked at commit on PostgreSQL.  Checked
 * at the insert, each takes a KEY SHARE lock on the parent row; when the order was inserted
 * before the stock was reserved, every concurrent order of one product held that lock on the
 * product row its reservation updates, and every such update built a multixact of all of them.
 * The reservation now comes first (orders.c), and at commit it holds the row anyway.  SQLite
 * checks a foreign key without locking anything: nothing to change there.
 */
static const char fk_at_commit_postgres[] =
    "ALTER TABLE orders ALTER CONSTRAINT orders_user_id_fkey DEFERRABLE INITIALLY DEFERRED;"
    "ALTER TABLE orders ALTER CONSTRAINT orders_product_id_fkey DEFERRABLE INITIALLY DEFERRED";

/*
 * Step 5: the counts behind /metrics' outbox and inbox figures, kept by triggers in the
 * transaction of each change, so a scrape sums a few rows instead of scanning two tables that
 * grow with every order (and the sweeper can delete old rows without changing what the inbox
 * figure means).  A count is the sum of its rows over `shard`: on PostgreSQL each connection adds
 * to the shard of its backend, so concurrent transactions rarely wait on one counter row; SQLite
 * has one writer and one shard.  Within a transaction the rows are taken in name order, so two
 * transactions cannot wait on each other's counter rows.
 *
 *   outbox:STATUS             messages in the outbox by status now (a sweep lowers "sent")
 *   inbox:TYPE:RESULT         provider events ever accepted by type (charge.succeeded,
 *                             refund.succeeded, other) and result (applied, ignored, other),
 *                             counted once the result is decided; a sweep leaves them.
 *
 * The indexes serve the retention sweeps (sweeper.c).
 */
#define INBOX_TYPE_LABEL(T)                                                                        \
    "CASE WHEN " T " IN ('charge.succeeded', 'refund.succeeded') THEN " T " ELSE 'other' END"
#define INBOX_RESULT_LABEL(R)                                                                      \
    "CASE WHEN " R " IN ('applied', 'ignored') THEN " R " ELSE 'other' END"
#define INBOX_NAME(T, R) "'inbox:' || " INBOX_TYPE_LABEL(T) " || ':' || " INBOX_RESULT_LABEL(R)
/* The SQL below is laid out as it reads; clang-format would fold each macro into a staircase. */
/* clang-format off */
#define COUNTS_TABLE                                                                               \
    "CREATE TABLE counts ("                                                                        \
    "  name TEXT NOT NULL,"                                                                        \
    "  shard INTEGER NOT NULL,"                                                                    \
    "  value BIGINT NOT NULL,"                                                                     \
    "  PRIMARY KEY (name, shard)"                                                                  \
    ");"                                                                                           \
    "INSERT INTO counts (name, shard, value)"                                                      \
    "  SELECT 'outbox:' || status, 0, COUNT(*) FROM outbox GROUP BY status;"                       \
    "INSERT INTO counts (name, shard, value)"                                                      \
    "  SELECT n, 0, COUNT(*) FROM (SELECT " INBOX_NAME("type", "result") " AS n FROM inbox"       \
    "  WHERE result <> 'received') t GROUP BY n;"                                                  \
    "CREATE INDEX inbox_received ON inbox (received_at);"

/* SQLite: one shard; `value = value + d` on the row of (name, 0) when COND holds. */
#define SQ_ADD_IF(NAME, D, COND)                                                                   \
    "INSERT INTO counts (name, shard, value) SELECT " NAME ", 0, " D " WHERE " COND                \
    " ON CONFLICT (name, shard) DO UPDATE SET value = value + excluded.value;"
#define SQ_ADD(NAME, D) SQ_ADD_IF(NAME, D, "1")

static const char counts_sqlite[] = COUNTS_TABLE
    "CREATE TRIGGER outbox_counts_insert AFTER INSERT ON outbox BEGIN "
        SQ_ADD("'outbox:' || NEW.status", "1")
    "END;"
    "CREATE TRIGGER outbox_counts_update AFTER UPDATE OF status ON outbox"
    " WHEN OLD.status <> NEW.status BEGIN "
        SQ_ADD("'outbox:' || OLD.status", "-1")
        SQ_ADD("'outbox:' || NEW.status", "1")
    "END;"
    "CREATE TRIGGER outbox_counts_delete AFTER DELETE ON outbox BEGIN "
        SQ_ADD("'outbox:' || OLD.status", "-1")
    "END;"
    "CREATE TRIGGER inbox_counts_insert AFTER INSERT ON inbox WHEN "
    "NEW.result <> 'received' BEGIN "
        SQ_ADD(INBOX_NAME("NEW.type", "NEW.result"), "1")
    "END;"
    "CREATE TRIGGER inbox_counts_update AFTER UPDATE OF result ON inbox"
    " WHEN OLD.result <> NEW.result BEGIN "
        SQ_ADD_IF(INBOX_NAME("OLD.type", "OLD.result"), "-1", "OLD.result <> 'received'")
        SQ_ADD(INBOX_NAME("NEW.type", "NEW.result"), "1")
    "END";

/* The inbox trigger's body, `GUARD` first (a statement that may return before counting). */
#define INBOX_COUNTS_BODY(GUARD)                                                                   \
    " BEGIN"                                                                                       \
    GUARD                                                                                          \
    "  PERFORM orderd_count_move("                                                                 \
    "    CASE WHEN TG_OP = 'UPDATE' AND OLD.result <> 'received' THEN "                            \
             INBOX_NAME("OLD.type", "OLD.result") " END,"                                          \
    "    CASE WHEN NEW.result <> 'received' THEN "                                                 \
             INBOX_NAME("NEW.type", "NEW.result") " END);"                                         \
    "  RETURN NULL;"                                                                               \
    " END $$"

/* PostgreSQL: the shard of the backend; a change of status adds to both rows in name order. */
static const char counts_postgres[] = COUNTS_TABLE
    "CREATE FUNCTION orderd_count(n TEXT, d BIGINT) RETURNS void LANGUAGE sql AS $$"
    "  INSERT INTO counts (name, shard, value) VALUES (n, pg_backend_pid() % 32, d)"
    "  ON CONFLICT (name, shard) DO UPDATE SET value = counts.value + excluded.value $$;"
    "CREATE FUNCTION orderd_count_move(a TEXT, b TEXT) RETURNS void LANGUAGE plpgsql AS $$"
    " BEGIN"
    "  IF a IS NOT DISTINCT FROM b THEN RETURN; END IF;"
    "  IF b IS NULL THEN PERFORM orderd_count(a, -1);"
    "  ELSIF a IS NULL THEN PERFORM orderd_count(b, 1);"
    "  ELSIF a < b THEN PERFORM orderd_count(a, -1); PERFORM orderd_count(b, 1);"
    "  ELSE PERFORM orderd_count(b, 1); PERFORM orderd_count(a, -1);"
    "  END IF;"
    " END $$;"
    "CREATE FUNCTION orderd_outbox_counts() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN"
    "  PERFORM orderd_count_move("
    "    CASE WHEN TG_OP <> 'INSERT' THEN 'outbox:' || OLD.status END,"
    "    CASE WHEN TG_OP <> 'DELETE' THEN 'outbox:' || NEW.status END);"
    "  RETURN NULL;"
    " END $$;"
    "CREATE TRIGGER outbox_counts AFTER INSERT OR UPDATE OF status OR DELETE ON outbox"
    "  FOR EACH ROW EXECUTE FUNCTION orderd_outbox_counts();"
    "CREATE FUNCTION orderd_inbox_counts() RETURNS trigger LANGUAGE plpgsql AS $$"
    INBOX_COUNTS_BODY("") ";"
    "CREATE TRIGGER inbox_counts AFTER INSERT OR UPDATE OF result ON inbox"
    "  FOR EACH ROW EXECUTE FUNCTION orderd_inbox_counts()";
/* clang-format on */

/*
 * Step 6: every per-user row names its user.  On a shard set a user's rows live on the cluster of
 * the user's bucket, and a move of a bucket selects the rows it carries by that column; orders and
 * profiles had it, the rows below reach their user only through an order or a payload.  What
 * exists is backfilled: a payment or a refund from its order; an order's confirmation email from
 * the order its dedupe key names ("order-<id>-confirmation", payments.c); a "profile changed"
 * email from its payload's metadata.userId, the only place it names its user (profile.c).  An
 * inbox row kept only the event's id, type and result, so an old one stays NULL, as does a new
 * one whose event named no user.
 */
#define USER_COLUMNS(PROFILE_USER)                                                                 \
    "ALTER TABLE payments ADD COLUMN user_id TEXT;"                                                \
    "ALTER TABLE refunds ADD COLUMN user_id TEXT;"                                                 \
    "ALTER TABLE outbox ADD COLUMN user_id TEXT;"                                                  \
    "ALTER TABLE inbox ADD COLUMN user_id TEXT;"                                                   \
    "UPDATE payments SET user_id ="                                                                \
    "  (SELECT o.user_id FROM orders o WHERE o.id = payments.order_id);"                           \
    "UPDATE refunds SET user_id ="                                                                 \
    "  (SELECT o.user_id FROM orders o WHERE o.id = refunds.order_id);"                            \
    "UPDATE outbox SET user_id = (SELECT o.user_id FROM orders o WHERE o.id ="                     \
    "  substr(outbox.dedupe_key, 7, length(outbox.dedupe_key) - 19))"                              \
    "  WHERE dedupe_key LIKE 'order-%-confirmation';"                                              \
    "UPDATE outbox SET user_id = " PROFILE_USER " WHERE kind = 'profile_changed'"

static const char user_columns_sqlite[] =
    USER_COLUMNS("json_extract(payload, '$.metadata.userId')");
static const char user_columns_postgres[] = USER_COLUMNS("CAST(payload AS jsonb) #>> "
                                                         "'{metadata,userId}'");

static const struct idem_migration steps[] = {
    {1, "business tables", tables_sqlite, tables_postgres},
    {2, "seed products", seed_products, seed_products},
    {3, "payments, refunds, outbox, inbox", payments_sqlite, payments_postgres},
    {4, "order foreign keys checked at commit", "SELECT 1", fk_at_commit_postgres},
    {5, "outbox and inbox counts kept by triggers", counts_sqlite, counts_postgres},
    {6, "payments, refunds, outbox, inbox name their user", user_columns_sqlite,
     user_columns_postgres},
};

int schema_migrate(struct idem_store *st, int *applied, char **errmsg)
{
    return schema_migrate_to(st, steps[sizeof steps / sizeof steps[0] - 1].version, applied,
                             errmsg);
}

int schema_migrate_to(struct idem_store *st, int version, int *applied, char **errmsg)
{
    size_t n = 0;

    while (n < sizeof steps / sizeof steps[0] && steps[n].version <= version)
        n++;
    return idem_store_migrate(st, "orderd", steps, n, applied, errmsg);
}

/*
 * A cluster of a shard set (docs/shards.md, "orderd on a shard set"): the user of an order or a
 * profile is checked in the catalogue, where the token named it; the cluster holds no users.
 */
static const char cluster_no_user_fk[] =
    "ALTER TABLE orders DROP CONSTRAINT orders_user_id_fkey;"
    "ALTER TABLE profiles DROP CONSTRAINT profiles_user_id_fkey";

/* Products too: an order's product is checked at its reservation, in the catalogue. */
static const char cluster_no_product_fk[] =
    "ALTER TABLE orders DROP CONSTRAINT orders_product_id_fkey";

/*
 * A user's rows move with the user's bucket (docs/shards.md, "Moving a bucket"): each table is
 * registered with its user column, parents first, which also fences its writes.  Rows of no user
 * (an inbox event without metadata.userId) stay where they are.
 */
static const char cluster_rows_move[] = "SELECT idem_shard_table('orders', 'user_id');"
                                        "SELECT idem_shard_table('profiles', 'user_id');"
                                        "SELECT idem_shard_table('payments', 'user_id');"
                                        "SELECT idem_shard_table('refunds', 'user_id');"
                                        "SELECT idem_shard_table('outbox', 'user_id');"
                                        "SELECT idem_shard_table('inbox', 'user_id')";

/*
 * The inbox figures count events ever accepted, so the copy of an event a move brings counts
 * nowhere again (its old cluster's count keeps it).  The outbox figures are messages now: the
 * move's delete and insert carry them over as they are.
 */
/* clang-format off */
static const char cluster_inbox_counts[] =
    "CREATE OR REPLACE FUNCTION orderd_inbox_counts() RETURNS trigger LANGUAGE plpgsql AS $$"
    INBOX_COUNTS_BODY("  IF current_setting('idem.mover', true) = 'on' THEN RETURN NULL; END IF;");
/* clang-format on */

static const struct idem_migration cluster_steps[] = {
    {1, "users are in the catalogue", "SELECT 1", cluster_no_user_fk},
    {2, "products are in the catalogue", "SELECT 1", cluster_no_product_fk},
    {3, "a user's rows move with the user's bucket", "SELECT 1", cluster_rows_move},
    {4, "a moved inbox event is not counted again", "SELECT 1", cluster_inbox_counts},
};

int schema_migrate_cluster(struct idem_store *st, int *applied, char **errmsg)
{
    return idem_store_migrate(st, "orderd_shard", cluster_steps,
                              sizeof cluster_steps / sizeof cluster_steps[0], applied, errmsg);
}

/*
 * The catalogue of a shard set: the stock each order took (stock.c), keyed by the request that
 * took it, so a retry takes nothing again and a cancel gives it back once.
 */
#define CATALOGUE_RESERVATIONS(INT)                                                                \
    "CREATE TABLE stock_reservations ("                                                            \
    "  user_id TEXT NOT NULL,"                                                                     \
    "  operation TEXT NOT NULL,"                                                                   \
    "  idem_key TEXT NOT NULL,"                                                                    \
    "  product_id TEXT NOT NULL REFERENCES products (id),"                                         \
    "  quantity " INT " NOT NULL,"                                                                 \
    "  unit_price " INT " NOT NULL,"                                                               \
    "  currency TEXT NOT NULL,"                                                                    \
    "  released " INT " NOT NULL DEFAULT 0,"                                                       \
    "  created_at TEXT NOT NULL,"                                                                  \
    "  PRIMARY KEY (user_id, operation, idem_key)"                                                 \
    ")"

static const char reservations_sqlite[] = CATALOGUE_RESERVATIONS("INTEGER");
static const char reservations_postgres[] = CATALOGUE_RESERVATIONS("BIGINT");

static const struct idem_migration catalogue_steps[] = {
    {1, "stock reservations", reservations_sqlite, reservations_postgres},
};

int schema_migrate_catalogue(struct idem_store *st, int *applied, char **errmsg)
{
    return idem_store_migrate(st, "orderd_catalogue", catalogue_steps,
                              sizeof catalogue_steps / sizeof catalogue_steps[0], applied, errmsg);
}
