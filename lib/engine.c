/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine.c - the record state machine: claim, replay, mismatch, wait, take over, phases.
 *
 * A request becomes a "call" on the record of its scope (principal, operation, key).  Ownership
 * is decided by the store's primary key (an insert that does nothing on conflict), never by a read
 * followed by an insert.  The owner runs the operation as atomic phases; each phase is one store
 * transaction that carries the business writes and moves the record's recovery point, so a crash
 * between phases loses nothing and a finished phase never runs twice.  Every phase commit is
 * fenced on the lease owner: a slow owner whose lease was taken over cannot commit behind the new
 * owner's back.
 *
 * Each call gets its own lease owner name ("<engine owner>/<n>"), so two threads of one process
 * fence each other just as two processes do.  Duplicates that find a live lease wait on a
 * condition variable that every phase end in this process signals, and otherwise poll the store
 * with growing pauses, so a storm of retries does not hammer it.
 *
 * A completed record never changes until retention deletes it, so its response is also kept in
 * the engine's replay cache (replay_cache.c): a replay, or a refusal of the same key with another
 * request, is then answered from memory with no store access at all.  What makes that safe is the
 * entry's lifetime, which must end before the record's retention does; see cache_lifetime().
 *
 * Why one file of ~2,000 lines: it is one state machine, and every transition (claim, wait,
 * takeover, phase, completion, the calls that do not wait) reads and sets the same fields of a
 * call under the same rules; split, each rule would have to be stated twice.  What is not the
 * state machine has its own file: the replay cache, the registry of scopes in flight in this
 * process (inflight.c), records, keys, fingerprints, the stores.
 *
 * THE STATES OF A CALL (enum call_state)
 *
 *   CALL_NEW         Being decided: inside idem_call_begin()/_recover() (call_start), or made for
 *                    an asynchronous step not handed to the store yet.  Never the application's.
 *   CALL_CACHED      Answered from the replay cache alone, before any store access (cached_call):
 *                    a REPLAY whose response is the cache entry's (call->cached), or a MISMATCH.
 *                    It has no scope and owns no record: only its answer may be read.
 *   CALL_IDLE        Holds nothing in the store -- no lease, no phase, no response: begin answered
 *                    MISMATCH, IN_PROGRESS or NONE, or the call gave its claim up (abort, forget, a
 *                    fence or a commit that failed before the record was durable).
 *   CALL_CLAIMED     Holds the record's lease, durably, with no phase open: a claim committed at
 *                    the operation's claim_point, a takeover (RESUME), a phase that advanced.
 *   CALL_IN_PHASE    A phase is open (call->tx): the claim's own transaction after EXECUTE (the
 *                    record inserted in it, or -- claim_deferred, a one-phase call -- not even
 *                    that yet), or one idem_call_phase_begin() opened.
 *   CALL_STAGED      The open phase holds a response idem_call_stage() wrote (call->staged_*),
 *                    not committed yet.
 *   CALL_CLAIMING    idem_call_begin_async(): the store runs the claim.
 *   CALL_RUNNING     idem_call_run_async(): the store's writer runs the whole phase.
 *   CALL_COMPLETING  idem_call_complete_async(): the store runs the completion.
 *   CALL_COMMITTING  idem_call_commit_async(): the staged phase's commit is on its way to disk.
 *   CALL_COMPLETED   Holds a stored response: a REPLAY read from the store (or from the replay
 *                    cache after waiting for a duplicate), or this call's own completion.
 *
 * In the four asynchronous states the call is the engine's until its callback: the application
 * may not touch it.  The transitions, and the functions that make them:
 *
 *   NEW -> CACHED                    cached_call(): the replay cache holds the key
 *   NEW -> COMPLETED                 call_start(): REPLAY
 *   NEW -> IDLE                      call_start(): MISMATCH, IN_PROGRESS, NONE
 *   NEW -> IN_PHASE                  try_claim(), defer_claim(): EXECUTE
 *   NEW -> CLAIMED                   claim_job_ended() (EXECUTE at a claim_point),
 *                                    call_start() after try_takeover() (RESUME)
 *   NEW -> CLAIMING                  idem_call_begin_async()
 *   CLAIMING -> CLAIMED | IDLE       claim_async_done(): claimed, or not
 *   NEW -> RUNNING                   idem_call_run_async()
 *   RUNNING -> IN_PHASE -> STAGED    run_job_run(): the application's run, on the store's writer,
 *     -> RUNNING                     then the phase's writes handed to the writer's batch
 *   RUNNING -> COMPLETED | IDLE      run_async_done(): committed, or nothing kept
 *   CLAIMED | IDLE -> IN_PHASE       idem_call_phase_begin()
 *   IN_PHASE | STAGED -> STAGED      stage_response() (idem_call_stage, idem_call_complete)
 *   STAGED -> IN_PHASE               stage_response() failing in the store (the phase stays
 *                                    open), commit_ready() finding the stage rolled back
 *   IN_PHASE -> CLAIMED              commit_phase() (idem_call_advance)
 *   IN_PHASE | STAGED -> CLAIMED | IDLE    rollback_phase() (abort, forget, a fence that failed),
 *                                    commit_phase() and response_committed() when COMMIT fails
 *   STAGED -> COMPLETED              response_committed() (idem_call_commit, _complete)
 *   STAGED -> COMMITTING             idem_call_commit_async()
 *   COMMITTING -> COMPLETED | CLAIMED | IDLE    response_committed_async()
 *   CLAIMED | IDLE -> COMPLETED      complete_at_once() (idem_call_complete, no phase open)
 *   CLAIMED | IDLE -> COMPLETING     idem_call_complete_async()
 *   COMPLETING -> COMPLETED | CLAIMED | IDLE    complete_async_done()
 *   CLAIMED -> IDLE                  idem_call_abort() (the lease released), idem_call_forget()
 *   any but the asynchronous four -> (freed)    idem_call_end()
 *
 * "CLAIMED | IDLE" where a phase or a step ends without completing is call_settle()'s choice,
 * by call->record_durable: whether the store holds the record beyond the phase, so that the call
 * holds its lease.  Facts that are not states stay fields of the call: record_durable and
 * claim_deferred within a phase, waited, recovering, speculated, the registry entry (inflight.c).
 *
 * Every public entry asserts, with assert_call_state(), that the call is in a state it allows,
 * and that the fields agree with that state (call_state_holds()); Debug and sanitizer builds
 * check it, NDEBUG ones compile it out.  An entry returns IDEM_ESTATE in the states the API says
 * it does: those are allowed.  What is asserted is that the application holds the call (not
 * NEW, no asynchronous step under way) and, in the callbacks, that the step is the one expected.
 */
#include "inflight.h"
#include "internal.h"
#include "replay_cache.h"

#include <assert.h>
#include <errno.h>
#include <openssl/rand.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TTL_MS (24LL * 3600 * 1000)
#define DEFAULT_LEASE_MS (10LL * 1000)
#define DEFAULT_WAIT_MS (2LL * 1000)
#define POLL_FIRST_MS 2
#define POLL_MAX_MS 100
#define CLAIM_ROUNDS_MAX 64
#define DEFAULT_REPLAY_CACHE_BYTES ((int64_t)8 << 20)
/* A cache entry dies this much before its record would, at most (clock steps, rate drift). */
#define CACHE_SLACK_MS 1000

#define TAKEN_HINTS 64

struct idem_engine {
    struct idem_store *st;
    char *owner;
    atomic_ullong next_call;
    struct idem__rcache *cache; /* NULL: off */
    /* idem_engine_stats(): relaxed adds, off every path but a claim's, an answer's, a refusal's. */
    atomic_ullong claims, answers, moved;

    /* Scopes this engine's calls claim or execute; wakes waiters when a record changes here. */
    struct idem__inflight *inflight;
    /* Scopes lately found taken by a call that did not read first (learn_taken_scope). */
    struct taken_hint {
        _Atomic uint64_t scope_hash;
        _Atomic int64_t until_ms;
    } taken[TAKEN_HINTS];
};

/*
 * A claim committed at once at its operation's claim_point: one whole transaction of one
 * statement, the record inserted already at its point (IDEM__TX_ONE_STATEMENT).
 */
struct claim_job {
    struct idem_call *call;
    int claimed;
};

/* An asynchronous claim (idem_call_begin_async) on its way through the store. */
struct claim_async {
    struct claim_job job;
    int64_t claim_mono;
    idem_call_begun begun;
    void *arg;
};

/*
 * A response stored with no phase open: one whole transaction of one statement (idem__tx_run).
 * The job owns the copies of the response it writes (response_copies()); complete_job_ended()
 * hands them to the call.
 */
struct complete_job {
    struct idem_call *call;
    int status;
    char *headers; /* encoded */
    void *body;
    size_t body_len;
};

/* An asynchronous completion (idem_call_complete_async) on its way through the store. */
struct complete_async {
    struct complete_job job;
    idem_call_done done;
    void *arg;
};

/*
 * A one-phase call run whole by the store's writer (idem_call_run_async): the record read on the
 * writer, the application's phase, its commit into the writer's batch.
 */
struct run_async {
    struct idem_call *call;
    idem_call_run run;
    idem_call_done done;
    void *arg;
    int found; /* the writer found a record of the scope: nothing ran */
    int runs;  /* how often the store ran it (a neighbour's failure runs it again) */
};

/* Where a call is (see the top of this file). */
enum call_state {
    CALL_NEW,
    CALL_CACHED,
    CALL_IDLE,
    CALL_CLAIMED,
    CALL_IN_PHASE,
    CALL_STAGED,
    CALL_CLAIMING,
    CALL_RUNNING,
    CALL_COMPLETING,
    CALL_COMMITTING,
    CALL_COMPLETED,
};

struct idem_call {
    struct idem_engine *eng;
    enum call_state state;
    struct idem_scope scope;
    char *principal, *operation, *key;
    char owner[320];
    int64_t ttl_ms, lease_ms, wait_ms;
    const char *const *stored_headers; /* the operation's allow-list (borrowed), NULL: default */
    size_t nstored_headers;
    const char *claim_point; /* the operation's (borrowed): a claim commits at once, there */
    int one_phase;           /* the operation's: a fresh key's record is written by its phase */
    unsigned char fp[IDEM_FP_LEN];

    struct idem_tx *tx; /* the open phase: IN_PHASE, STAGED */
    /*
     * The step in flight without a waiting thread (idem_call_begin_async, _complete_async,
     * _run_async, _commit_async; one at a time): the engine's side in `async`, the store's job in
     * `job_slot`.  Both live in the call, so the step allocates nothing on the caller's thread for
     * the store's to free; they go with the call, on its owner's thread.
     */
    union {
        struct claim_async claim;
        struct complete_async complete;
        struct run_async run;
        struct {
            idem_call_done done; /* idem_call_commit_async(): told once durable or failed */
            void *arg;
        } commit;
    } async;
    struct idem__job_slot job_slot;
    int record_durable; /* the record exists beyond the open phase (committed): CLAIMED, not IDLE */
    /*
     * A one-phase call's open phase, whose record is not in the store yet: the phase's first
     * record write inserts it (completed, or processing at an advance's point).
     */
    int claim_deferred;
    int speculated; /* a one-phase call run without reading first (IDEM__STORE_SPECULATES) */
    int waited;
    int recovering; /* IN_PROGRESS: the lease holder is a recovery worker */
    int retry_after_s;
    /* Taken before our claim's insert, so the record is no older; 0: resumed, age unknown. */
    int64_t claimed_mono_ms;

    /* In the engine's in-flight registry: same-process duplicates wait for this call in memory. */
    struct idem__inflight_entry inflight;

    /* A REPLAY answered from the replay cache: the response is this entry's (a reference). */
    const struct idem__rentry *cached;

    /*
     * A response written into the open phase by idem_call_stage(), not yet committed: copies for
     * the replay cache and the response accessors once idem_call_commit() made it durable.
     */
    int staged_status;
    char *staged_headers;      /* the allow-listed headers, encoded */
    unsigned staged_rollbacks; /* the tx's ROLLBACK TO count when the response was staged */
    void *staged_body;         /* NUL-terminated; not NULL from STAGED until the commit ended */
    size_t staged_body_len;

    struct idem_record rec; /* last state read, or what this call stored */
    struct idem_header *headers;
    size_t nheaders;
    char errmsg[IDEM_ERRMSG_MAX];
};

#define CALL_IN(state) (1u << (state))
/* The states in which the application holds a call: every entry but the callbacks allows them. */
#define CALL_HELD                                                                                  \
    (CALL_IN(CALL_CACHED) | CALL_IN(CALL_IDLE) | CALL_IN(CALL_CLAIMED) | CALL_IN(CALL_IN_PHASE) |  \
     CALL_IN(CALL_STAGED) | CALL_IN(CALL_COMPLETED))

#ifdef NDEBUG
#define assert_call_state(call, allowed) ((void)0)
#else
static const char *const call_state_names[] = {
    "NEW",      "CACHED",  "IDLE",       "CLAIMED",    "IN_PHASE",  "STAGED",
    "CLAIMING", "RUNNING", "COMPLETING", "COMMITTING", "COMPLETED",
};

/* Whether the call's fields agree with its state (the invariants of the table at the top). */
static int call_state_holds(const struct idem_call *call)
{
    switch (call->state) {
    case CALL_NEW:
        return 1;
    case CALL_CACHED:
        return !call->principal && !call->tx && !call->record_durable;
    case CALL_IDLE:
        return call->principal && !call->tx && !call->record_durable && !call->staged_body;
    case CALL_CLAIMED:
        return call->principal && !call->tx && call->record_durable && !call->staged_body;
    case CALL_IN_PHASE:
        return call->tx && !call->staged_body;
    case CALL_STAGED:
        return call->tx && call->staged_body;
    case CALL_CLAIMING:
    case CALL_RUNNING:
    case CALL_COMPLETING:
    case CALL_COMMITTING:
        return call->principal && !call->tx;
    case CALL_COMPLETED:
        return !call->tx && !call->staged_body && !call->claim_deferred;
    }
    return 0;
}

static void call_state_check(const struct idem_call *call, unsigned allowed, const char *entry)
{
    if (!(allowed & CALL_IN(call->state)) || !call_state_holds(call))
        fprintf(stderr, "libidem: %s() on a call in state %s%s\n", entry,
                call_state_names[call->state],
                allowed & CALL_IN(call->state) ? " whose fields disagree with it" : "");
    assert(allowed & CALL_IN(call->state));
    assert(call_state_holds(call));
}

/* That `call` is in one of the `allowed` states (a mask of CALL_IN()), and as that state says. */
#define assert_call_state(call, allowed) call_state_check((call), (allowed), __func__)
#endif

/*
 * Where a call stands when a phase or a step ended without completing it: holding the record's
 * lease if the store has the record beyond the phase, else nothing.
 */
static void call_settle(struct idem_call *call)
{
    call->state = call->record_durable ? CALL_CLAIMED : CALL_IDLE;
}

/* Whether the call holds a response: completed, or a REPLAY answered from the replay cache. */
static int call_completed(const struct idem_call *call)
{
    return call->state == CALL_COMPLETED || call->cached;
}

/* Whether a phase is open (call->tx), a response staged in it or not. */
static int call_in_phase(const struct idem_call *call)
{
    return call->state == CALL_IN_PHASE || call->state == CALL_STAGED;
}

static void call_free(struct idem_call *call);

int idem_engine_new(struct idem_store *st, const struct idem_engine_options *opts,
                    struct idem_engine **out)
{
    int rc = IDEM_ENOMEM;
    struct idem_engine *eng = NULL;
    char owner[256];
    int64_t cache_bytes =
        opts && opts->replay_cache_bytes ? opts->replay_cache_bytes : DEFAULT_REPLAY_CACHE_BYTES;

    if (!st || !out)
        return IDEM_EINVAL;
    *out = NULL;
    eng = calloc(1, sizeof(*eng));
    if (!eng)
        goto out;
    if (cache_bytes > 0) {
        rc = (int64_t)(size_t)cache_bytes != cache_bytes
                 ? IDEM_EINVAL
                 : idem__rcache_new((size_t)cache_bytes, &eng->cache);
        if (rc < 0)
            goto out;
        rc = IDEM_ENOMEM;
    }
    if (opts && opts->owner) {
        idem__fmt(owner, sizeof(owner), "%s", opts->owner);
    } else {
        char host[128] = "localhost";
        unsigned char rnd[4] = {0};
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        if (RAND_bytes(rnd, sizeof(rnd)) != 1)
            memset(rnd, 0, sizeof(rnd));
        idem__fmt(owner, sizeof(owner), "%s:%ld:%02x%02x%02x%02x", host, (long)getpid(), rnd[0],
                  rnd[1], rnd[2], rnd[3]);
    }
    eng->owner = idem__strdup(owner);
    if (!eng->owner)
        goto out;
    eng->st = st;
    atomic_init(&eng->next_call, 1);
    rc = idem__inflight_new(&eng->inflight);
    if (rc < 0)
        goto out;
    *out = eng;
    eng = NULL;
    rc = 0;
out:
    if (eng) {
        idem__rcache_free(eng->cache);
        free(eng->owner);
        free(eng);
    }
    return rc;
}

void idem_engine_free(struct idem_engine *eng)
{
    if (!eng)
        return;
    idem__inflight_free(eng->inflight);
    idem__rcache_free(eng->cache);
    free(eng->owner);
    free(eng);
}

const char *idem_engine_owner(const struct idem_engine *eng)
{
    return eng ? eng->owner : NULL;
}

void idem_engine_stats(const struct idem_engine *eng, struct idem_engine_stats *out)
{
    struct idem_engine *e = (struct idem_engine *)eng; /* C11's atomic_load takes no const */

    if (!out)
        return;
    *out = (struct idem_engine_stats){0};
    if (!e)
        return;
    out->claims = atomic_load_explicit(&e->claims, memory_order_relaxed);
    out->answers = atomic_load_explicit(&e->answers, memory_order_relaxed);
    out->moved = atomic_load_explicit(&e->moved, memory_order_relaxed);
}

/* ---- changes in this process: the in-flight registry (inflight.c) ------------------------ */

/*
 * A record changed in this process: wakes every waiter.  `leaving`, if not NULL, is a call whose
 * scope leaves flight at the same moment (it completed, was released, or executes nothing); its
 * watches are called.
 */
static void notify_changed(struct idem_engine *eng, struct idem_call *leaving)
{
    idem__inflight_changed(eng->inflight, leaving ? &leaving->inflight : NULL);
}

/*
 * Sleeps up to `ms`, or less if the record may have changed: woken by the store when it can tell
 * (PostgreSQL's LISTEN/NOTIFY reaches every process), else by a change in this process.
 */
static void wait_for_change(struct idem_engine *eng, const struct idem_scope *s, int64_t ms)
{
    if (eng->st->m->wait_change(eng->st, s, ms) == 0)
        return;
    idem__inflight_wait_change(eng->inflight, ms);
}

/* Why the last idem_call_begin() of this thread failed (idem_call_begin_error). */
static _Thread_local char begin_error[IDEM_ERRMSG_MAX];

const char *idem_call_begin_error(void)
{
    return begin_error;
}

static int call_fail(struct idem_call *call, int rc, const char *what, const char *detail)
{
    if (rc == IDEM_EMOVED)
        atomic_fetch_add_explicit(&call->eng->moved, 1, memory_order_relaxed);
    idem__fmt(call->errmsg, sizeof(call->errmsg), "%s: %s", what,
              detail && detail[0] ? detail : idem_strerror(rc));
    return rc;
}

/*
 * How long a cache entry may answer for a record that expires `left_ms` after a moment the caller
 * measured `since_mono_ms` (the monotonic clock, taken before that moment was read in the store's
 * clock), with `ttl_ms` the record's whole retention.  The entry must die before the record does:
 * after that another instance may sweep it and run the key afresh, and a replay from memory
 * would then answer with the old result.  So the lifetime counts from the earliest local moment
 * that can correspond to the store's reading, and keeps a slack for clocks that step or drift
 * (the store's clock may be another machine's).
 */
static int64_t cache_lifetime(int64_t since_mono_ms, int64_t left_ms, int64_t ttl_ms)
{
    int64_t slack = ttl_ms / 10 < CACHE_SLACK_MS ? ttl_ms / 10 : CACHE_SLACK_MS;
    return since_mono_ms + left_ms - slack - clock_mono_ms();
}

/*
 * Caches the completed record just read (at local time `read_mono_ms`, taken before the read),
 * for what is left of its retention window: it dies before the record could be swept or replaced.
 */
static void cache_fill_from_read(struct idem_call *call, int64_t read_mono_ms)
{
    const struct idem_record *rec = &call->rec;

    (void)idem__rcache_insert(call->eng->cache, &call->scope, rec->fp, rec->response_status,
                              rec->response_headers, rec->response_body, rec->response_body_len,
                              cache_lifetime(read_mono_ms, rec->expires_ms - rec->store_now_ms,
                                             rec->expires_ms - rec->created_ms));
}

/* Reads the record outside any transaction (a plain read; WAL readers never block writers). */
static int read_record(struct idem_call *call)
{
    struct idem_store *st = call->eng->st;
    struct idem_conn *conn = NULL;
    int64_t t0 = clock_mono_ms();
    int rc;

    idem__record_clear(&call->rec);
    rc = idem__store_get(st, &conn, call->errmsg, sizeof(call->errmsg));
    if (rc < 0)
        return rc;
    rc = st->cm->record_get(conn, &call->scope, &call->rec);
    if (rc < 0)
        call_fail(call, rc, "read record", st->cm->errmsg(conn));
    idem__store_put(st, conn); /* before copying into the cache: the copy needs no store */
    if (rc == 0 && call->eng->cache && call->rec.found && call->rec.status == IDEM_REC_COMPLETED &&
        call->rec.response_body_len < idem__rcache_max_entry(call->eng->cache))
        cache_fill_from_read(call, t0);
    return rc;
}

/*
 * A one-phase call that ran without reading first (IDEM__STORE_SPECULATES) and found its key taken,
 * or a run the store's thread found a record for (idem_call_run_async), leaves its scope in the
 * engine's hints for TAKEN_HINT_MS: the caller's next begin of that scope -- a caller retries at
 * once after IDEM_ELEASE or IDEM_CALL_ASK_BEGIN, often on another thread -- reads the record first
 * and answers from it (a replay, a mismatch, a lease to wait for or take over) instead of running
 * the phase again for nothing.  A hint is only a hint: a slot another scope took over, or one
 * read while it is rewritten, costs one speculation or one read, never a wrong answer.
 */
#define TAKEN_HINT_MS 5000

static uint64_t scope_hash(const struct idem_scope *s)
{
    const char *parts[3] = {s->principal, s->operation, s->key};
    uint64_t h = 1469598103934665603ULL; /* FNV-1a, the parts NUL-separated */

    for (int i = 0; i < 3; i++) {
        for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++)
            h = (h ^ *p) * 1099511628211ULL;
        h = (h ^ 0) * 1099511628211ULL;
    }
    return h;
}

static void learn_taken_scope(struct idem_engine *eng, const struct idem_scope *s)
{
    uint64_t h = scope_hash(s);
    struct taken_hint *t = &eng->taken[h % TAKEN_HINTS];

    atomic_store_explicit(&t->scope_hash, h, memory_order_relaxed);
    atomic_store_explicit(&t->until_ms, clock_mono_ms() + TAKEN_HINT_MS, memory_order_relaxed);
}

static void learn_taken_key(struct idem_call *call)
{
    if (call->speculated)
        learn_taken_scope(call->eng, &call->scope);
}

/* Whether a speculated call of `s` lately found it taken (the hint is used up). */
static int key_known_taken(struct idem_engine *eng, const struct idem_scope *s)
{
    uint64_t h = scope_hash(s);
    struct taken_hint *t = &eng->taken[h % TAKEN_HINTS];

    if (atomic_load_explicit(&t->until_ms, memory_order_relaxed) <= clock_mono_ms() ||
        atomic_load_explicit(&t->scope_hash, memory_order_relaxed) != h)
        return 0;
    atomic_store_explicit(&t->until_ms, 0, memory_order_relaxed);
    return 1;
}

/*
 * Answers from the replay cache if it holds the scope's completed record: REPLAY (*hit is then a
 * reference for the call) or MISMATCH.  Returns whether it answered.
 */
static int cache_answer(struct idem_engine *eng, const struct idem_scope *s,
                        const unsigned char fp[IDEM_FP_LEN], const struct idem__rentry **hit,
                        enum idem_outcome *outcome)
{
    const struct idem__rentry *e = eng->cache ? idem__rcache_get(eng->cache, s) : NULL;

    if (!e)
        return 0;
    if (memcmp(e->fp, fp, IDEM_FP_LEN) == 0) {
        *hit = e;
        *outcome = IDEM_OUTCOME_REPLAY;
    } else {
        idem__rcache_put(e);
        *outcome = IDEM_OUTCOME_MISMATCH;
    }
    return 1;
}

/* Tries to insert the record; on success the claim's transaction stays open as the first phase. */
static int try_claim(struct idem_call *call, int *claimed)
{
    struct idem_store *st = call->eng->st;
    struct idem_tx *tx = NULL;
    int rc;

    *claimed = 0;
    rc = idem_tx_begin(st, 1, &tx);
    if (rc < 0)
        return call_fail(call, rc, "begin claim", tx ? NULL : "no store connection");
    rc = st->cm->record_insert(idem__tx_conn(tx), &call->scope, call->fp, call->owner,
                               call->lease_ms, call->ttl_ms, "", claimed);
    if (rc < 0 || !*claimed) {
        if (rc < 0)
            call_fail(call, rc, "claim", st->cm->errmsg(idem__tx_conn(tx)));
        idem_tx_rollback(tx);
        return rc;
    }
    call->tx = tx;
    call->state = CALL_IN_PHASE;
    return 0;
}

/*
 * A one-phase operation's fresh key (the read found no record): the phase opens without the
 * record, which its first record write inserts (stage_response, idem_call_advance).  Nothing is
 * in the store until then, so a rollback leaves nothing to release; a claim of another process
 * in between is met by that insert.
 */
static int defer_claim(struct idem_call *call)
{
    int rc = idem_tx_begin(call->eng->st, 1, &call->tx);

    if (rc < 0)
        return call_fail(call, rc, "begin phase", call->tx ? NULL : "no store connection");
    call->claim_deferred = 1;
    call->state = CALL_IN_PHASE;
    return 0;
}

static int claim_job_run(struct idem_conn *c, void *arg)
{
    struct claim_job *j = arg;
    struct idem_call *call = j->call;
    int rc =
        call->eng->st->cm->record_insert(c, &call->scope, call->fp, call->owner, call->lease_ms,
                                         call->ttl_ms, call->claim_point, &j->claimed);

    if (rc < 0)
        return rc;
    /* A batch's claim answered by its COMMIT is kept: it may have won. */
    return j->claimed == IDEM__CLAIM_AT_COMMIT || j->claimed ? 0 : IDEM__TX_DISCARD;
}

/* How a claim job ended (rc as idem__tx_run returned): *claimed, or a failure. */
static int claim_job_ended(struct idem_call *call, const struct claim_job *j, int rc,
                           const char *err, int *claimed)
{
    *claimed = 0;
    if (rc < 0)
        return call_fail(call, rc, "claim", err);
    *claimed = rc == 0 && j->claimed == 1;
    if (*claimed) {
        call->record_durable = 1;
        call->state = CALL_CLAIMED;
    }
    return 0;
}

/*
 * try_claim() for an operation with a claim_point: the claim and its recovery point commit
 * together, durably (the store runs it whole: idem__tx_run), and no phase stays open.
 */
static int try_claim_at_point(struct idem_call *call, int *claimed)
{
    struct claim_job j = {call, 0};
    char err[IDEM_ERRMSG_MAX] = "";
    int rc;

    rc = idem__tx_run(call->eng->st, claim_job_run, &j, IDEM__TX_ONE_STATEMENT, err, sizeof(err));
    return claim_job_ended(call, &j, rc, err, claimed);
}

/* A claim that won, as every later step reads it: the record is ours, at its recovery point. */
static int claim_won(struct idem_call *call, int64_t claim_mono)
{
    /* A one-phase call's record lands with its answer: counted then (response_committed). */
    if (!call->one_phase)
        atomic_fetch_add_explicit(&call->eng->claims, 1, memory_order_relaxed);
    call->claimed_mono_ms = claim_mono;
    idem__record_clear(&call->rec);
    call->rec.found = 1;
    call->rec.recovery_point = idem__strdup(call->claim_point ? call->claim_point : "");
    return call->rec.recovery_point ? 0 : IDEM_ENOMEM;
}

/*
 * Takes over an expired lease and re-reads the record under the same write lock.  The takeover is
 * fenced on the fingerprint this call compared: between that read and this write the record may
 * have been swept and claimed afresh by another request, and a retry must never resume a record
 * of a different request (it reads again instead, and finds the mismatch).
 */
static int try_takeover(struct idem_call *call, int *won)
{
    struct idem_store *st = call->eng->st;
    struct idem_tx *tx = NULL;
    int rc;

    *won = 0;
    rc = idem_tx_begin(st, 1, &tx);
    if (rc < 0)
        return call_fail(call, rc, "begin takeover", NULL);
    rc = st->cm->record_takeover(idem__tx_conn(tx), &call->scope, call->fp, call->owner,
                                 call->lease_ms, won);
    if (rc == 0 && *won) {
        idem__record_clear(&call->rec);
        rc = st->cm->record_get(idem__tx_conn(tx), &call->scope, &call->rec);
    }
    if (rc < 0) {
        call_fail(call, rc, "take over", st->cm->errmsg(idem__tx_conn(tx)));
        idem_tx_rollback(tx);
        *won = 0;
        return rc;
    }
    rc = idem_tx_commit(tx);
    if (rc < 0) {
        *won = 0;
        return call_fail(call, rc, "commit takeover", NULL);
    }
    return 0;
}

static int load_response(struct idem_call *call)
{
    free(call->headers);
    call->headers = NULL;
    call->nheaders = 0;
    return idem__headers_decode(call->rec.response_headers, &call->headers, &call->nheaders);
}

/*
 * Retry-After for a duplicate of a request still running: about as long as it has run so far (a
 * request that has taken 3 s is likely to need about as long again; the lease, sized for the
 * slowest, would have a client wait 40 s for a 5 s call), never past the lease's end, where its
 * owner is presumed dead and the next attempt takes over, and between 1 and 60 s.
 */
static int retry_after_from_lease(const struct idem_record *rec)
{
    int64_t lease_left = rec->lease_expires_ms - rec->store_now_ms;
    int64_t ran = rec->store_now_ms - rec->created_ms;
    int64_t ms = ran < lease_left ? ran : lease_left;
    int64_t s = (ms + 999) / 1000;
    if (s < 1)
        s = 1;
    if (s > 60)
        s = 60;
    return (int)s;
}

/* Whether a lease owner name is a recovery worker's ("<engine owner>/r<n>"). */
static int owner_is_recovery(const char *owner)
{
    const char *slash = owner ? strrchr(owner, '/') : NULL;
    return slash && slash[1] == 'r';
}

/*
 * The hot path of a replay: the replay cache's answer for the scope, with no copies, no lease
 * owner name and no store.  Returns 1 with *out and *outcome (REPLAY or MISMATCH) when the cache
 * knows the record, 0 when it does not, or IDEM_ENOMEM.
 */
static int cached_call(struct idem_engine *eng, const struct idem_operation *op,
                       const char *principal, const char *key, const unsigned char *fp,
                       struct idem_call **out, enum idem_outcome *outcome)
{
    const struct idem_scope s = {principal, op->name, key};
    const struct idem__rentry *hit = NULL;
    enum idem_outcome oc = IDEM_OUTCOME_NONE;
    struct idem_call *call;

    if (!cache_answer(eng, &s, fp, &hit, &oc))
        return 0;
    call = calloc(1, sizeof(*call));
    if (!call) {
        idem__rcache_put(hit);
        return IDEM_ENOMEM;
    }
    call->eng = eng;
    call->retry_after_s = 1;
    call->cached = hit;
    call->state = CALL_CACHED;
    *outcome = oc;
    *out = call;
    return 1;
}

/* A new call of `op` on the scope (fp NULL: a recovery worker's), in no table yet. */
static int call_new(struct idem_engine *eng, const struct idem_operation *op, const char *principal,
                    const char *key, const unsigned char *fp, struct idem_call **out)
{
    struct idem_call *call = calloc(1, sizeof(*call));

    *out = NULL;
    if (!call)
        return IDEM_ENOMEM;
    call->eng = eng;
    call->principal = idem__strdup(principal);
    call->operation = idem__strdup(op->name);
    call->key = idem__strdup(key);
    if (!call->principal || !call->operation || !call->key) {
        call_free(call);
        return IDEM_ENOMEM;
    }
    call->scope.principal = call->principal;
    call->scope.operation = call->operation;
    call->scope.key = call->key;
    call->inflight.scope = &call->scope;
    call->ttl_ms = op->ttl_ms > 0 ? op->ttl_ms : DEFAULT_TTL_MS;
    call->lease_ms = op->lease_ms > 0 ? op->lease_ms : DEFAULT_LEASE_MS;
    call->wait_ms = op->wait_ms > 0 ? op->wait_ms : DEFAULT_WAIT_MS;
    call->stored_headers = op->stored_headers;
    call->nstored_headers = op->stored_headers ? op->nstored_headers : 0;
    call->claim_point = op->claim_point;
    call->one_phase = op->one_phase && !op->claim_point;
    call->retry_after_s = 1;
    if (fp)
        memcpy(call->fp, fp, IDEM_FP_LEN);
    idem__fmt(call->owner, sizeof(call->owner), "%s/%s%llu", eng->owner, fp ? "" : "r",
              (unsigned long long)atomic_fetch_add(&eng->next_call, 1));
    *out = call;
    return 0;
}

/*
 * The state machine shared by requests (fp given: claim, replay, mismatch, wait) and recovery
 * workers (fp NULL: never claim, never wait, take the fingerprint from the record).
 */
static int call_start(struct idem_engine *eng, const struct idem_operation *op,
                      const char *principal, const char *key, const unsigned char *fp,
                      struct idem_call **out, enum idem_outcome *outcome)
{
    int rc = 0;
    struct idem_call *call = NULL;
    const int recover = fp == NULL;
    int64_t deadline;
    int64_t pause = POLL_FIRST_MS;
    int claim_lost = 0;
    int64_t claim_mono;

    if (out)
        *out = NULL;
    if (outcome)
        *outcome = IDEM_OUTCOME_NONE;
    if (!eng || !op || !op->name || !principal || !key || !out || !outcome)
        return IDEM_EINVAL;

    if (!recover) {
        rc = cached_call(eng, op, principal, key, fp, out, outcome);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }

    rc = call_new(eng, op, principal, key, fp, &call);
    if (rc < 0)
        return rc;
    deadline = recover ? clock_mono_ms() : clock_mono_ms() + call->wait_ms;
    if (!recover)
        idem__inflight_enter(eng->inflight, &call->inflight, deadline, &call->waited);

    for (int round = 0;; round++) {
        if (round >= CLAIM_ROUNDS_MAX) {
            rc = call_fail(call, IDEM_EUNAVAIL, "claim", "the record kept changing under us");
            goto out;
        }
        /* A duplicate that waited for the first request of its scope finds its answer in memory. */
        if ((round > 0 || call->waited) && !recover &&
            cache_answer(eng, &call->scope, call->fp, &call->cached, outcome)) {
            call->state = call->cached ? CALL_COMPLETED : CALL_IDLE;
            break;
        }
        /*
         * A fresh request claims first where the store wants it and the replay cache already
         * said the key is not a completed one of this process (IDEM__STORE_CLAIMS_FIRST): the claim
         * usually wins, and a read before it was work for nothing.  Otherwise, and on every
         * later round, the record is read first; an empty call->rec (round 0) claims.
         */
        if (round > 0 || recover || call->waited || !eng->cache ||
            !(eng->st->m->flags & IDEM__STORE_CLAIMS_FIRST) ||
            (call->one_phase && (!(eng->st->m->flags & IDEM__STORE_SPECULATES) ||
                                 key_known_taken(eng, &call->scope)))) {
            rc = read_record(call);
            if (rc < 0)
                goto out;
        } else if (call->one_phase) {
            call->speculated = 1;
        }

        if (!call->rec.found && recover) {
            call->state = CALL_IDLE;
            break; /* nothing to recover: outcome NONE */
        }
        if (!call->rec.found) {
            int claimed = 0;
            if (claim_lost) {
                /*
                 * Our last claim met a record this read cannot see yet: another caller's claim
                 * whose commit has not landed (a group commit still on its way to disk).  Wait
                 * for that commit's wake-up instead of hammering the store with claims.
                 */
                wait_for_change(eng, &call->scope, pause);
                pause = pause * 2 > POLL_MAX_MS ? POLL_MAX_MS : pause * 2;
            }
            claim_mono = clock_mono_ms();
            if (call->one_phase) {
                rc = defer_claim(call);
                if (rc == 0)
                    rc = claim_won(call, claim_mono);
                if (rc < 0)
                    goto out;
                *outcome = IDEM_OUTCOME_EXECUTE;
                break;
            }
            rc = call->claim_point ? try_claim_at_point(call, &claimed) : try_claim(call, &claimed);
            if (rc < 0)
                goto out;
            if (claimed) {
                rc = claim_won(call, claim_mono);
                if (rc < 0)
                    goto out;
                *outcome = IDEM_OUTCOME_EXECUTE;
                break;
            }
            claim_lost = 1;
            continue; /* someone else's insert won: read what they made */
        }
        if (recover)
            memcpy(call->fp, call->rec.fp, IDEM_FP_LEN);
        if (memcmp(call->rec.fp, call->fp, IDEM_FP_LEN) != 0) {
            call->state = CALL_IDLE;
            *outcome = IDEM_OUTCOME_MISMATCH;
            break;
        }
        if (call->rec.status == IDEM_REC_COMPLETED) {
            rc = load_response(call);
            if (rc < 0)
                goto out;
            call->state = CALL_COMPLETED;
            *outcome = IDEM_OUTCOME_REPLAY;
            break;
        }
        if (call->rec.lease_expires_ms <= call->rec.store_now_ms) {
            int won = 0;
            rc = try_takeover(call, &won);
            if (rc < 0)
                goto out;
            if (won) {
                atomic_fetch_add_explicit(&eng->claims, 1, memory_order_relaxed);
                call->record_durable = 1;
                call->state = CALL_CLAIMED;
                *outcome = IDEM_OUTCOME_RESUME;
                break;
            }
            continue;
        }
        /* A live lease: wait for its owner, but not past wait_ms. */
        int64_t left = deadline - clock_mono_ms();
        if (left <= 0) {
            call->retry_after_s = retry_after_from_lease(&call->rec);
            call->recovering = owner_is_recovery(call->rec.lease_owner);
            call->state = CALL_IDLE;
            *outcome = IDEM_OUTCOME_IN_PROGRESS;
            break;
        }
        call->waited = 1;
        wait_for_change(eng, &call->scope, pause < left ? pause : left);
        pause = pause * 2 > POLL_MAX_MS ? POLL_MAX_MS : pause * 2;
    }
    /* Only a call that executes keeps its scope in flight; the others let their waiters go. */
    if (call->inflight.in && *outcome != IDEM_OUTCOME_EXECUTE && *outcome != IDEM_OUTCOME_RESUME)
        notify_changed(eng, call);
    assert_call_state(call, CALL_HELD); /* decided */
    *out = call;
    call = NULL;
out:
    if (call && rc < 0)
        idem__fmt(begin_error, sizeof(begin_error), "%s", call->errmsg);
    call_free(call);
    return rc;
}

int idem_call_begin(struct idem_engine *eng, const struct idem_operation *op, const char *principal,
                    const char *key, const unsigned char fp[IDEM_FP_LEN], struct idem_call **out,
                    enum idem_outcome *outcome)
{
    if (!fp) {
        if (out)
            *out = NULL;
        return IDEM_EINVAL;
    }
    return call_start(eng, op, principal, key, fp, out, outcome);
}

/* The store ran the claim: tell the caller how it ended. */
static void claim_async_done(void *arg, int rc, const char *errmsg)
{
    struct idem_call *call = arg;
    struct claim_async *a = &call->async.claim;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    int claimed = 0;

    assert_call_state(call, CALL_IN(CALL_CLAIMING));
    rc = claim_job_ended(call, &a->job, rc, errmsg, &claimed);
    call_settle(call); /* CLAIMED when it won, else IDLE */
    if (rc == 0 && claimed) {
        rc = claim_won(call, a->claim_mono);
        if (rc == 0)
            outcome = IDEM_OUTCOME_EXECUTE;
        else
            call_fail(call, rc, "claim", NULL);
    }
    a->begun(call, rc, outcome, a->arg); /* (the call may be gone after) */
}

/*
 * The call of a request the store is to run without a thread waiting (idem_call_begin_async,
 * idem_call_run_async): 1 with *out (new) in flight; 0 when the replay cache holds the key or
 * another call of this engine has it in flight (the blocking way answers it); or a negative code.
 */
static int async_call_new(struct idem_engine *eng, const struct idem_operation *op,
                          const char *principal, const char *key, const unsigned char *fp,
                          struct idem_call **out)
{
    const struct idem_scope s = {principal, op->name, key};
    const struct idem__rentry *hit = NULL;
    enum idem_outcome oc = IDEM_OUTCOME_NONE;
    int rc;

    *out = NULL;
    if (cache_answer(eng, &s, fp, &hit, &oc)) {
        idem__rcache_put(hit);
        return 0;
    }
    rc = call_new(eng, op, principal, key, fp, out);
    if (rc < 0)
        return rc;
    if (!idem__inflight_try_enter(eng->inflight, &(*out)->inflight)) {
        call_free(*out);
        *out = NULL;
        return 0;
    }
    return 1;
}

int idem_call_begin_async(struct idem_engine *eng, const struct idem_operation *op,
                          const char *principal, const char *key,
                          const unsigned char fp[IDEM_FP_LEN], idem_call_begun begun, void *arg)
{
    char err[IDEM_ERRMSG_MAX] = "";
    struct claim_async *a;
    struct idem_call *call = NULL;
    int rc;

    if (!eng || !op || !op->name || !principal || !key || !fp || !begun)
        return IDEM_EINVAL;
    /* Only a claim that needs no read first, and runs whole without a waiting thread. */
    if (!op->claim_point || !eng->cache || !(eng->st->m->flags & IDEM__STORE_CLAIMS_FIRST) ||
        !idem__tx_runs_async(eng->st))
        return 0;
    rc = async_call_new(eng, op, principal, key, fp, &call);
    if (rc <= 0)
        return rc;
    a = &call->async.claim;
    *a = (struct claim_async){{call, 0}, clock_mono_ms(), begun, arg};
    call->state = CALL_CLAIMING;
    rc = idem__tx_run_async(eng->st, &call->job_slot, claim_job_run, &a->job,
                            IDEM__TX_ONE_STATEMENT | IDEM__TX_CLAIM, claim_async_done, call, err,
                            sizeof(err));
    if (rc < 0) {
        call_free(call);
        return rc;
    }
    return 1;
}

int idem_call_lookup(struct idem_engine *eng, const struct idem_operation *op,
                     const char *principal, const char *key, const unsigned char fp[IDEM_FP_LEN],
                     struct idem_call **out, enum idem_outcome *outcome)
{
    int rc;

    if (out)
        *out = NULL;
    if (outcome)
        *outcome = IDEM_OUTCOME_NONE;
    if (!eng || !op || !op->name || !principal || !key || !fp || !out || !outcome)
        return IDEM_EINVAL;
    rc = cached_call(eng, op, principal, key, fp, out, outcome);
    return rc < 0 ? rc : 0;
}

int idem_watch_inflight(struct idem_engine *eng, const struct idem_operation *op,
                        const char *principal, const char *key, void (*changed)(void *arg),
                        void *arg, struct idem_watch **out)
{
    const struct idem_scope s = {principal, op ? op->name : NULL, key};

    if (out)
        *out = NULL;
    if (!eng || !op || !op->name || !principal || !key || !changed || !out)
        return IDEM_EINVAL;
    return idem__inflight_watch(eng->inflight, &s, changed, arg, out);
}

void idem_watch_end(struct idem_watch *w)
{
    idem__inflight_watch_end(w);
}

int idem_call_recover(struct idem_engine *eng, const struct idem_operation *op,
                      const char *principal, const char *key, struct idem_call **out,
                      enum idem_outcome *outcome)
{
    return call_start(eng, op, principal, key, NULL, out, outcome);
}

int idem_call_recovering(const struct idem_call *call)
{
    if (!call)
        return 0;
    assert_call_state(call, CALL_HELD);
    return call->recovering;
}

int idem_engine_stalled(struct idem_engine *eng, const char *operation, int limit,
                        struct idem_stalled **out, size_t *n)
{
    struct idem_store *st;
    struct idem_conn *conn = NULL;
    char err[IDEM_ERRMSG_MAX];
    int rc;

    if (out)
        *out = NULL;
    if (n)
        *n = 0;
    if (!eng || !out || !n || limit < 0)
        return IDEM_EINVAL;
    st = eng->st;
    rc = idem__store_get(st, &conn, err, sizeof(err));
    if (rc < 0)
        return rc;
    rc = st->cm->record_stalled(conn, operation, limit, out, n);
    idem__store_put(st, conn);
    return rc;
}

int idem_engine_release_leases(struct idem_engine *eng, const char *owner_prefix,
                               uint64_t *released)
{
    struct idem_store *st;
    struct idem_tx *tx = NULL;
    char except[300];
    int n = 0;
    int rc;

    if (released)
        *released = 0;
    if (!eng || !owner_prefix)
        return IDEM_EINVAL;
    st = eng->st;
    /* This engine's calls are "<engine owner>/<n>": none of them is released. */
    idem__fmt(except, sizeof(except), "%s/", eng->owner);
    rc = idem_tx_begin(st, 1, &tx);
    if (rc < 0)
        return rc;
    rc = st->cm->record_release_owned(idem__tx_conn(tx), owner_prefix, except, &n);
    if (rc < 0) {
        idem_tx_rollback(tx);
        return rc;
    }
    rc = idem_tx_commit(tx);
    if (rc == 0 && released)
        *released = (uint64_t)n;
    return rc;
}

int idem_call_phase_begin(struct idem_call *call)
{
    int rc;
    if (!call)
        return IDEM_EINVAL;
    assert_call_state(call, CALL_HELD);
    if (call_in_phase(call) || call_completed(call))
        return call_fail(call, IDEM_ESTATE, "phase begin",
                         call_in_phase(call) ? "a phase is already open" : "the call is completed");
    if (call->state == CALL_CACHED) /* a MISMATCH from the replay cache: no scope, no record */
        return call_fail(call, IDEM_ESTATE, "phase begin", "the call owns no record");
    rc = idem_tx_begin(call->eng->st, 1, &call->tx);
    if (rc < 0)
        return call_fail(call, rc, "phase begin", NULL);
    call->state = CALL_IN_PHASE;
    return 0;
}

struct idem_tx *idem_call_tx(struct idem_call *call)
{
    if (!call)
        return NULL;
    assert_call_state(call, CALL_HELD);
    return call->tx;
}

/* Drops the staged response, if any: the phase that held it ended without storing it. */
static void unstage(struct idem_call *call)
{
    free(call->staged_headers);
    free(call->staged_body);
    call->staged_headers = NULL;
    call->staged_body = NULL;
    call->staged_body_len = 0;
    call->staged_status = 0;
}

/* Rolls the open phase back: its writes, the claim it holds and a staged response are gone. */
static void rollback_phase(struct idem_call *call)
{
    idem_tx_rollback(call->tx);
    call->tx = NULL;
    call->claim_deferred = 0;
    unstage(call);
    call_settle(call);
}

/*
 * A fenced update of the record changed nothing: the phase is rolled back and IDEM_ELEASE
 * returned.  After a stage in this phase that can also be the stage itself, still in place.
 */
static int fence_failed(struct idem_call *call, const char *what)
{
    int rc = call_fail(call, IDEM_ELEASE, what,
                       call->state == CALL_STAGED
                           ? "the record is not processing under this call's lease: "
                             "another owner took it over, or the response staged in "
                             "this phase is still in place (roll back to a savepoint "
                             "taken before it first)"
                           : "another owner took the lease over");
    rollback_phase(call);
    return rc;
}

/* The first record write of a deferred claim found the key taken: the phase is rolled back. */
static int deferred_claim_lost(struct idem_call *call, const char *what)
{
    int rc = call_fail(call, IDEM_ELEASE, what,
                       call->state == CALL_STAGED
                           ? "the response staged in this phase is still in place "
                             "(roll back to a savepoint taken before it first)"
                           : "another request claimed the key first");
    rollback_phase(call);
    learn_taken_key(call);
    return rc;
}

/* Commits the open phase; the record has changed, so waiting duplicates are woken. */
static int commit_phase(struct idem_call *call, const char *what)
{
    char err[IDEM_ERRMSG_MAX] = "";
    int rc = idem__tx_commit_err(call->tx, err, sizeof(err));

    call->tx = NULL;
    call->claim_deferred = 0;
    unstage(call);
    notify_changed(call->eng, NULL);
    if (rc < 0) {
        call_settle(call);
        return call_fail(call, rc, what, err[0] ? err : NULL);
    }
    call->record_durable = 1;
    call->state = CALL_CLAIMED;
    return 0;
}

int idem_call_advance(struct idem_call *call, const char *point, const char *data)
{
    struct idem_store *st;
    char *p = NULL, *d = NULL;
    int ok = 0;
    int rc;

    if (!call || !point)
        return IDEM_EINVAL;
    assert_call_state(call, CALL_HELD);
    if (!call_in_phase(call))
        return call_fail(call, IDEM_ESTATE, "advance", "no phase is open");
    st = call->eng->st;
    p = idem__strdup(point);
    d = data ? idem__strdup(data) : NULL;
    if (!p || (data && !d)) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    if (call->claim_deferred) {
        /* The record goes in now, processing, with the lease, then to its point as ever. */
        rc = st->cm->record_insert(idem__tx_conn(call->tx), &call->scope, call->fp, call->owner,
                                   call->lease_ms, call->ttl_ms, "", &ok);
        if (rc < 0) {
            call_fail(call, rc, "claim", st->cm->errmsg(idem__tx_conn(call->tx)));
            goto out;
        }
        if (!ok) {
            rc = deferred_claim_lost(call, "claim");
            goto out;
        }
        call->claim_deferred = 0;
    }
    rc = st->cm->record_advance(idem__tx_conn(call->tx), &call->scope, call->owner, point, data,
                                call->lease_ms, &ok);
    if (rc < 0) {
        call_fail(call, rc, "advance", st->cm->errmsg(idem__tx_conn(call->tx)));
        goto out;
    }
    if (!ok) {
        rc = fence_failed(call, "advance");
        goto out;
    }
    rc = commit_phase(call, "commit phase");
    if (rc < 0)
        goto out;
    free(call->rec.recovery_point);
    free(call->rec.recovery_data);
    call->rec.recovery_point = p;
    call->rec.recovery_data = d;
    p = d = NULL;
out:
    free(p);
    free(d);
    return rc;
}

/* The arguments of a response to store: a status of 100..599, headers and body as announced. */
static int response_args_ok(int status, const struct idem_header *headers, size_t nheaders,
                            const void *body, size_t body_len)
{
    return !(nheaders > 0 && !headers) && !(body_len > 0 && !body) && status >= 100 &&
           status <= 599;
}

/*
 * Writes the response into the open phase (status completed, no lease), fenced on the lease, and
 * keeps copies of what it wrote for commit_response().  A response staged before in this phase
 * is replaced by the copies (its row was rolled back to a savepoint by the caller, or the fence
 * fails).
 */
/* What is stored of a response: the kept headers, encoded, and a copy of the body (+ NUL). */
static int response_copies(const struct idem_call *call, const struct idem_header *headers,
                           size_t nheaders, const void *body, size_t body_len, char **text,
                           void **copy)
{
    int rc =
        idem__headers_encode(headers, nheaders, call->stored_headers, call->nstored_headers, text);
    if (rc < 0)
        return rc;
    *copy = malloc(body_len + 1);
    if (!*copy) {
        free(*text);
        *text = NULL;
        return IDEM_ENOMEM;
    }
    if (body_len)
        memcpy(*copy, body, body_len);
    ((char *)*copy)[body_len] = '\0';
    return 0;
}

static int stage_response(struct idem_call *call, int status, const struct idem_header *headers,
                          size_t nheaders, const void *body, size_t body_len)
{
    struct idem_store *st = call->eng->st;
    char *text = NULL;
    void *copy = NULL;
    int ok = 0;
    int rc;

    rc = response_copies(call, headers, nheaders, body, body_len, &text, &copy);
    if (rc < 0)
        goto out;
    if (call->claim_deferred)
        rc = st->cm->record_insert_completed(idem__tx_conn(call->tx), &call->scope, call->fp,
                                             call->ttl_ms, status, text, body, body_len, &ok);
    else
        rc = st->cm->record_complete(idem__tx_conn(call->tx), &call->scope, call->owner, status,
                                     text, body, body_len, &ok);
    if (rc < 0) {
        call_fail(call, rc, "stage response", st->cm->errmsg(idem__tx_conn(call->tx)));
        unstage(call);
        call->state = CALL_IN_PHASE;
        goto out;
    }
    if (!ok) {
        rc = call->claim_deferred ? deferred_claim_lost(call, "stage response")
                                  : fence_failed(call, "stage response");
        goto out;
    }
    unstage(call);
    call->staged_status = status;
    call->staged_rollbacks = idem__tx_rollbacks(call->tx);
    call->staged_headers = text;
    call->staged_body = copy;
    call->staged_body_len = body_len;
    call->state = CALL_STAGED;
    text = NULL;
    copy = NULL;
out:
    free(text);
    free(copy);
    return rc;
}

/*
 * The staged response's phase ended with `rc`: once committed, the response goes into the cache
 * before duplicates are woken to look for it, and becomes the call's response.
 */
static int response_committed(struct idem_call *call, int rc, const char *errmsg)
{
    if (rc == 0) {
        if (call->one_phase && call->claimed_mono_ms)
            atomic_fetch_add_explicit(&call->eng->claims, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&call->eng->answers, 1, memory_order_relaxed);
        call->record_durable = 1;
        if (call->eng->cache && call->claimed_mono_ms)
            (void)idem__rcache_insert(
                call->eng->cache, &call->scope, call->fp, call->staged_status, call->staged_headers,
                call->staged_body, call->staged_body_len,
                cache_lifetime(call->claimed_mono_ms, call->ttl_ms, call->ttl_ms));
    }
    notify_changed(call->eng, call);
    if (rc < 0) {
        int taken = rc == IDEM_ELEASE && call->claim_deferred;
        call->claim_deferred = 0;
        unstage(call);
        call_settle(call);
        rc = call_fail(call, rc, "commit response", errmsg);
        if (taken)
            learn_taken_key(call);
        return rc;
    }
    call->claim_deferred = 0;
    call->state = CALL_COMPLETED;
    call->rec.status = IDEM_REC_COMPLETED;
    call->rec.response_status = call->staged_status;
    free(call->rec.response_headers);
    free(call->rec.response_body);
    call->rec.response_headers = call->staged_headers;
    call->rec.response_body = call->staged_body;
    call->rec.response_body_len = call->staged_body_len;
    call->staged_headers = NULL;
    call->staged_body = NULL;
    unstage(call);
    return load_response(call);
}

/* Commits the phase that holds the staged response. */
static int commit_response(struct idem_call *call)
{
    char err[IDEM_ERRMSG_MAX];
    int rc = idem__tx_commit_err(call->tx, err, sizeof(err));

    call->tx = NULL;
    return response_committed(call, rc, rc < 0 ? err : NULL);
}

int idem_call_stage(struct idem_call *call, int status, const struct idem_header *headers,
                    size_t nheaders, const void *body, size_t body_len)
{
    if (!call || !response_args_ok(status, headers, nheaders, body, body_len))
        return IDEM_EINVAL;
    assert_call_state(call, CALL_HELD);
    if (call_completed(call))
        return call_fail(call, IDEM_ESTATE, "stage response", "the call is completed");
    if (!call_in_phase(call))
        return call_fail(call, IDEM_ESTATE, "stage response", "no phase is open");
    return stage_response(call, status, headers, nheaders, body, body_len);
}

/*
 * What idem_call_commit() and idem_call_commit_async() need: an open phase holding a stage.  When
 * the application rolled back to a savepoint since the stage, the stage may be gone with it (the
 * record processing again in the transaction): that is read in the transaction, and a commit then
 * fails instead of reporting, and caching, a response the store does not hold.
 */
static int commit_ready(struct idem_call *call)
{
    struct idem_store *st;
    struct idem_record rec;
    int rc, still;

    if (call_completed(call))
        return call_fail(call, IDEM_ESTATE, "commit response", "the call is completed");
    if (call->state != CALL_STAGED)
        return call_fail(call, IDEM_ESTATE, "commit response",
                         call_in_phase(call) ? "no response is staged" : "no phase is open");
    if (idem__tx_rollbacks(call->tx) == call->staged_rollbacks)
        return 0;
    st = call->eng->st;
    memset(&rec, 0, sizeof(rec));
    rc = st->cm->record_get(idem__tx_conn(call->tx), &call->scope, &rec);
    still = rc == 0 && rec.found && rec.status == IDEM_REC_COMPLETED &&
            rec.response_status == call->staged_status;
    idem__record_clear(&rec);
    if (rc < 0)
        return call_fail(call, rc, "commit response", st->cm->errmsg(idem__tx_conn(call->tx)));
    if (!still) {
        unstage(call);
        call->state = CALL_IN_PHASE;
        return call_fail(call, IDEM_ESTATE, "commit response",
                         "the staged response was rolled back (ROLLBACK TO a savepoint taken "
                         "before idem_call_stage): stage it again, or abort");
    }
    call->staged_rollbacks = idem__tx_rollbacks(call->tx);
    return 0;
}

int idem_call_commit(struct idem_call *call)
{
    int rc;

    if (!call)
        return IDEM_EINVAL;
    assert_call_state(call, CALL_HELD);
    rc = commit_ready(call);
    return rc < 0 ? rc : commit_response(call);
}

/* The store's word on an asynchronous commit: finish the call, then tell its owner. */
static void response_committed_async(void *arg, int rc, const char *errmsg)
{
    struct idem_call *call = arg;

    assert_call_state(call, CALL_IN(CALL_COMMITTING));
    rc = response_committed(call, rc, errmsg);
    call->async.commit.done(call, rc, call->async.commit.arg); /* (the call may be gone after) */
}

int idem_call_commit_async(struct idem_call *call, idem_call_done done, void *arg)
{
    char err[IDEM_ERRMSG_MAX] = "";
    struct idem_tx *tx;
    int rc;

    if (!call || !done)
        return IDEM_EINVAL;
    assert_call_state(call, CALL_HELD);
    rc = commit_ready(call);
    if (rc < 0)
        return rc;
    call->async.commit.done = done;
    call->async.commit.arg = arg;
    tx = call->tx;
    call->tx = NULL;
    call->state = CALL_COMMITTING;
    rc = idem__tx_commit_async(tx, &call->job_slot, response_committed_async, call, err,
                               sizeof(err));
    if (rc < 0)
        return response_committed(call, rc, err[0] ? err : NULL);
    return 0;
}

/* The job for `call`'s response, with its copies made. */
static int complete_job_init(struct complete_job *j, struct idem_call *call, int status,
                             const struct idem_header *headers, size_t nheaders, const void *body,
                             size_t body_len)
{
    *j = (struct complete_job){call, status, NULL, NULL, body_len};
    return response_copies(call, headers, nheaders, body, body_len, &j->headers, &j->body);
}

static int complete_job_run(struct idem_conn *c, void *arg)
{
    struct complete_job *j = arg;
    struct idem_call *call = j->call;
    int ok = 0;
    int rc = call->eng->st->cm->record_complete(c, &call->scope, call->owner, j->status, j->headers,
                                                j->body, j->body_len, &ok);

    return rc < 0 ? rc : ok ? 0 : IDEM__TX_DISCARD;
}

/*
 * A completion job ended with `rc`: its copies become the call's response once durable; a fence
 * that failed is IDEM_ELEASE.
 */
static int complete_job_ended(struct complete_job *j, int rc, const char *err)
{
    struct idem_call *call = j->call;

    if (rc == IDEM__TX_DISCARD) {
        free(j->headers);
        free(j->body);
        call_settle(call);
        return call_fail(call, IDEM_ELEASE, "complete", "another owner took the lease over");
    }
    unstage(call);
    call->staged_status = j->status;
    call->staged_headers = j->headers;
    call->staged_body = j->body;
    call->staged_body_len = j->body_len;
    return response_committed(call, rc, rc < 0 ? err : NULL);
}

/* Whether `call` (no phase open) may still be completed; IDEM_ESTATE otherwise. */
static int phaseless_completable(struct idem_call *call)
{
    if (call_completed(call))
        return call_fail(call, IDEM_ESTATE, "complete", "the call is completed");
    if (call->state == CALL_CACHED) /* a MISMATCH from the replay cache: no scope, no record */
        return call_fail(call, IDEM_ESTATE, "complete", "the call owns no record");
    return 0;
}

/*
 * idem_call_complete() of a call with no phase open (a durable claim, a resumed record): the
 * fenced completion is the whole transaction, so the store runs it without handing this thread
 * its writer.
 */
static int complete_at_once(struct idem_call *call, int status, const struct idem_header *headers,
                            size_t nheaders, const void *body, size_t body_len)
{
    char err[IDEM_ERRMSG_MAX] = "";
    struct complete_job j;
    int rc = complete_job_init(&j, call, status, headers, nheaders, body, body_len);

    if (rc < 0)
        return call_fail(call, rc, "complete", NULL);
    rc =
        idem__tx_run(call->eng->st, complete_job_run, &j, IDEM__TX_ONE_STATEMENT, err, sizeof(err));
    return complete_job_ended(&j, rc, err);
}

static void complete_async_done(void *arg, int rc, const char *errmsg)
{
    struct idem_call *call = arg;
    struct complete_async *a = &call->async.complete;

    assert_call_state(call, CALL_IN(CALL_COMPLETING));
    rc = complete_job_ended(&a->job, rc, errmsg);
    a->done(call, rc, a->arg); /* (the call may be gone after) */
}

int idem_call_complete_async(struct idem_call *call, int status, const struct idem_header *headers,
                             size_t nheaders, const void *body, size_t body_len,
                             idem_call_done done, void *arg)
{
    char err[IDEM_ERRMSG_MAX] = "";
    struct complete_async *a;
    int rc;

    if (!call || !done || !response_args_ok(status, headers, nheaders, body, body_len))
        return IDEM_EINVAL;
    assert_call_state(call, CALL_HELD);
    if (call_in_phase(call))
        return call_fail(call, IDEM_ESTATE, "complete", "a phase is open");
    rc = phaseless_completable(call);
    if (rc < 0)
        return rc;
    if (!idem__tx_runs_async(call->eng->st)) {
        rc = complete_at_once(call, status, headers, nheaders, body, body_len);
        done(call, rc, arg);
        return 0;
    }
    a = &call->async.complete;
    a->done = done;
    a->arg = arg;
    rc = complete_job_init(&a->job, call, status, headers, nheaders, body, body_len);
    if (rc == 0) {
        call->state = CALL_COMPLETING;
        rc =
            idem__tx_run_async(call->eng->st, &call->job_slot, complete_job_run, &a->job,
                               IDEM__TX_ONE_STATEMENT, complete_async_done, call, err, sizeof(err));
    }
    if (rc < 0) {
        free(a->job.headers);
        free(a->job.body);
        call_settle(call);
        return call_fail(call, rc, "complete", err[0] ? err : NULL);
    }
    return 0;
}

int idem_call_complete(struct idem_call *call, int status, const struct idem_header *headers,
                       size_t nheaders, const void *body, size_t body_len)
{
    int rc;

    if (!call || !response_args_ok(status, headers, nheaders, body, body_len))
        return IDEM_EINVAL;
    assert_call_state(call, CALL_HELD);
    if (!call_in_phase(call)) { /* (a completed call has no phase) */
        rc = phaseless_completable(call);
        return rc < 0 ? rc : complete_at_once(call, status, headers, nheaders, body, body_len);
    }
    rc = stage_response(call, status, headers, nheaders, body, body_len);
    if (rc == 0)
        rc = commit_response(call);
    return rc;
}

/*
 * The job, on the writer (which sees every commit and this batch's members; its reads need no
 * gate: whatever it tells comes with this batch's notice, told once the batch is durable).
 */
static int run_job_run(struct idem_conn *c, void *arg)
{
    struct run_async *a = arg;
    struct idem_call *call = a->call;
    struct idem_store *st = call->eng->st;
    struct idem_record rec;
    int rc;

    assert_call_state(call, CALL_IN(CALL_RUNNING));
    /* Run again from the start if a neighbour's failure undid this run (IDEM__TX_RERUNNABLE). */
    a->found = 0;
    unstage(call);
    /*
     * A store that speculates (IDEM__STORE_SPECULATES) skips the read the first time: the record
     * inserted completed is checked by the COMMIT, and a key found taken there fails the batch,
     * whose runs then go again alone -- this one reading first.
     */
    if (a->runs++ > 0 || !(st->m->flags & IDEM__STORE_SPECULATES) ||
        key_known_taken(call->eng, &call->scope)) {
        rc = st->cm->record_get(c, &call->scope, &rec);
        if (rc < 0)
            return call_fail(call, rc, "read record", st->cm->errmsg(c));
        a->found = rec.found;
        idem__record_clear(&rec);
        if (a->found)
            return IDEM__TX_DISCARD;
    }
    rc = idem__tx_lend(st, c, &call->tx);
    if (rc == 0) {
        call->state = CALL_IN_PHASE; /* the application's run sees the phase as after EXECUTE */
        rc = claim_won(call, clock_mono_ms());
    }
    if (rc < 0) {
        rollback_phase(call); /* (lent: only the handle goes; the runner undoes the writes) */
        call->state = CALL_RUNNING;
        return call_fail(call, rc, "run", NULL);
    }
    call->claim_deferred = 1;
    rc = a->run(call, a->arg);
    if (rc == 0)
        rc = commit_ready(call); /* a response staged, and still there */
    if (call->tx) {
        idem_tx_rollback(call->tx); /* the handle; the runner keeps or undoes the writes */
        call->tx = NULL;
    }
    call->claim_deferred = 0;
    call->state = CALL_RUNNING; /* the batch's commit decides */
    if (rc < 0)
        unstage(call);
    return rc;
}

/* The store's word on the job, once its batch is durable (or failed): tell the caller. */
static void run_async_done(void *arg, int rc, const char *errmsg)
{
    struct idem_call *call = arg;
    const struct run_async *a = &call->async.run;
    idem_call_done done = a->done;
    void *done_arg = a->arg;
    int found = a->found;

    assert_call_state(call, CALL_IN(CALL_RUNNING));
    if (rc == IDEM__TX_DISCARD || (rc == IDEM_ELEASE && !found)) {
        /* A record was there, or another process's insert came first: nothing was kept. */
        learn_taken_scope(call->eng, &call->scope);
        unstage(call);
        call_settle(call); /* (IDLE: nothing of it is durable) */
        rc = IDEM_CALL_ASK_BEGIN;
    } else {
        rc = response_committed(call, rc, errmsg);
    }
    done(call, rc, done_arg);
}

int idem_call_run_async(struct idem_engine *eng, const struct idem_operation *op,
                        const char *principal, const char *key, const unsigned char fp[IDEM_FP_LEN],
                        idem_call_run run, idem_call_done done, void *arg)
{
    char err[IDEM_ERRMSG_MAX] = "";
    struct run_async *a;
    struct idem_call *call = NULL;
    int rc;

    if (!eng || !op || !op->name || !principal || !key || !fp || !run || !done)
        return IDEM_EINVAL;
    if (!op->one_phase || op->claim_point || !idem__tx_runs_async(eng->st))
        return 0;
    rc = async_call_new(eng, op, principal, key, fp, &call);
    if (rc <= 0)
        return rc;
    a = &call->async.run;
    *a = (struct run_async){call, run, done, arg, 0, 0};
    call->state = CALL_RUNNING;
    rc = idem__tx_run_async(eng->st, &call->job_slot, run_job_run, a, IDEM__TX_RERUNNABLE,
                            run_async_done, call, err, sizeof(err));
    if (rc < 0) {
        call_free(call);
        return rc;
    }
    return 1;
}

void idem_call_abort(struct idem_call *call)
{
    struct idem_store *st;
    struct idem_tx *tx = NULL;

    if (!call)
        return;
    assert_call_state(call, CALL_HELD);
    st = call->eng->st;
    if (call_in_phase(call))
        rollback_phase(call);
    /* A claim that never committed vanished with the rollback (IDLE); a durable one is released. */
    if (call->state == CALL_CLAIMED && idem_tx_begin(st, 1, &tx) == 0) {
        if (st->cm->record_release(idem__tx_conn(tx), &call->scope, call->owner) == 0)
            idem_tx_commit(tx);
        else
            idem_tx_rollback(tx);
        call->record_durable = 0;
        call->state = CALL_IDLE;
    }
    notify_changed(call->eng, call);
}

int idem_call_forget(struct idem_call *call)
{
    struct idem_store *st;
    struct idem_tx *tx = NULL;
    int ok = 0;
    int rc;

    if (!call)
        return IDEM_EINVAL;
    assert_call_state(call, CALL_HELD);
    if (call->state != CALL_CLAIMED && !call_in_phase(call))
        return call_fail(call, IDEM_ESTATE, "forget", "the call holds no record's lease");
    st = call->eng->st;
    if (call_in_phase(call))
        rollback_phase(call);
    if (call->state == CALL_IDLE) {
        notify_changed(call->eng, call);
        return 0; /* the claim never committed: it is gone with the rollback */
    }
    rc = idem_tx_begin(st, 1, &tx);
    if (rc < 0)
        return call_fail(call, rc, "forget", "no store connection");
    rc = st->cm->record_forget(idem__tx_conn(tx), &call->scope, call->owner, &ok);
    if (rc < 0) {
        call_fail(call, rc, "forget", st->cm->errmsg(idem__tx_conn(tx)));
        idem_tx_rollback(tx);
        return rc;
    }
    if (!ok) {
        idem_tx_rollback(tx);
        return call_fail(call, IDEM_ELEASE, "forget", "another owner holds the record");
    }
    rc = idem_tx_commit(tx);
    if (rc < 0)
        return call_fail(call, rc, "forget", "commit failed");
    call->record_durable = 0;
    call->state = CALL_IDLE;
    notify_changed(call->eng, call);
    return 0;
}

/* Frees the call, in any state: what holds a phase or a lease gives it up first. */
static void call_free(struct idem_call *call)
{
    if (!call)
        return;
    if (call_in_phase(call) || call->state == CALL_CLAIMED)
        idem_call_abort(call);
    if (call->inflight.in)
        notify_changed(call->eng, call);
    idem__rcache_put(call->cached);
    idem__record_clear(&call->rec);
    unstage(call);
    free(call->headers);
    free(call->principal);
    free(call->operation);
    free(call->key);
    free(call);
}

void idem_call_end(struct idem_call *call)
{
    if (!call)
        return;
    assert_call_state(call, CALL_HELD);
    call_free(call);
}

const char *idem_call_recovery_point(const struct idem_call *call)
{
    if (!call)
        return "";
    assert_call_state(call, CALL_HELD);
    return call->rec.recovery_point ? call->rec.recovery_point : "";
}

const char *idem_call_recovery_data(const struct idem_call *call)
{
    if (!call)
        return NULL;
    assert_call_state(call, CALL_HELD);
    return call->rec.recovery_data;
}

int idem_call_waited(const struct idem_call *call)
{
    if (!call)
        return 0;
    assert_call_state(call, CALL_HELD);
    return call->waited;
}

int idem_call_retry_after_s(const struct idem_call *call)
{
    if (!call)
        return 1;
    assert_call_state(call, CALL_HELD);
    return call->retry_after_s;
}

int idem_call_response_status(const struct idem_call *call)
{
    if (!call)
        return 0;
    assert_call_state(call, CALL_HELD);
    if (!call_completed(call))
        return 0;
    return call->cached ? call->cached->status : call->rec.response_status;
}

const void *idem_call_response_body(const struct idem_call *call, size_t *len)
{
    const void *body = NULL;
    size_t n = 0;

    if (call)
        assert_call_state(call, CALL_HELD);
    if (call && call->cached) { /* (a REPLAY from the replay cache) */
        body = call->cached->body;
        n = call->cached->body_len;
    } else if (call && call_completed(call)) {
        body = call->rec.response_body;
        n = call->rec.response_body_len;
    }
    if (len)
        *len = n;
    return body;
}

size_t idem_call_response_header_count(const struct idem_call *call)
{
    if (!call)
        return 0;
    assert_call_state(call, CALL_HELD);
    if (!call_completed(call))
        return 0;
    return call->cached ? call->cached->nheaders : call->nheaders;
}

const struct idem_header *idem_call_response_header(const struct idem_call *call, size_t i)
{
    if (i >= idem_call_response_header_count(call))
        return NULL;
    return call->cached ? &call->cached->headers[i] : &call->headers[i];
}

const char *idem_call_errmsg(const struct idem_call *call)
{
    if (!call)
        return "no call";
    assert_call_state(call, CALL_HELD);
    return call->errmsg;
}

int idem_record_inspect(struct idem_engine *eng, const char *principal, const char *operation,
                        const char *key, struct idem_record_info *out)
{
    struct idem_scope s = {principal, operation, key};
    struct idem_record rec;
    struct idem_tx *tx = NULL;
    int rc;

    if (!eng || !principal || !operation || !key || !out)
        return IDEM_EINVAL;
    memset(out, 0, sizeof(*out));
    memset(&rec, 0, sizeof(rec));
    rc = idem_tx_begin(eng->st, 0, &tx);
    if (rc < 0)
        return rc;
    rc = eng->st->cm->record_get(idem__tx_conn(tx), &s, &rec);
    idem_tx_rollback(tx);
    if (rc < 0 || !rec.found)
        goto out;
    out->found = 1;
    out->completed = rec.status == IDEM_REC_COMPLETED;
    idem__fmt(out->recovery_point, sizeof(out->recovery_point), "%s",
              rec.recovery_point ? rec.recovery_point : "");
    idem_fingerprint_hex(rec.fp, out->fingerprint_hex);
    out->created_ms = rec.created_ms;
    out->expires_ms = rec.expires_ms;
    if (!out->completed) {
        out->lease_expires_ms = rec.lease_expires_ms;
        out->lease_live = rec.lease_expires_ms > rec.store_now_ms;
    } else {
        out->response_status = rec.response_status;
        out->response_body_len = rec.response_body_len;
    }
out:
    idem__record_clear(&rec);
    return rc;
}

int idem_records_unfinished(struct idem_engine *eng, const char *operation,
                            const struct idem_record_id *after, struct idem_record_id *out,
                            int limit)
{
    struct idem_record_listed *page;
    int n;

    if (!eng || !out || limit < 1 || limit > 1000)
        return IDEM_EINVAL;
    page = calloc((size_t)limit, sizeof(*page));
    if (!page)
        return IDEM_ENOMEM;
    /* The one listing statement (store.c), of which only the scopes are kept. */
    n = idem_store_records_unfinished(eng->st, operation, after, page, limit);
    for (int i = 0; i < n; i++)
        out[i] = page[i].id;
    free(page);
    return n;
}

void idem_engine_cache_stats(struct idem_engine *eng, struct idem_cache_stats *out)
{
    struct idem__rcache_stats st;

    memset(out, 0, sizeof(*out));
    if (!eng || !eng->cache)
        return;
    idem__rcache_stats(eng->cache, &st);
    out->hits = st.hits;
    out->misses = st.misses;
    out->evictions = st.evictions;
    out->expired = st.expired;
    out->entries = st.entries;
    out->bytes = st.bytes;
    out->max_bytes = st.max_bytes;
}

int idem_engine_sweep(struct idem_engine *eng, int limit, int *deleted)
{
    struct idem_store *st;
    struct idem_tx *tx = NULL;
    int n = 0;
    int rc;

    if (deleted)
        *deleted = 0;
    if (!eng || limit <= 0)
        return IDEM_EINVAL;
    st = eng->st;
    rc = idem_tx_begin(st, 1, &tx);
    if (rc < 0)
        return rc;
    rc = st->cm->record_sweep(idem__tx_conn(tx), limit, &n);
    if (rc < 0) {
        idem_tx_rollback(tx);
        return rc;
    }
    rc = idem_tx_commit(tx);
    if (rc == 0 && deleted)
        *deleted = n;
    return rc;
}
