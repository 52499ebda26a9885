#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Mutation testing of the durability proof: every deliberate bug below must be caught.

Each mutant is a small textual substitution anchored on a snippet of a source file (never a line
number), applied to a scratch copy of the tree; the crash test (tests/power/test_power_loss.c)
and the store contract suite then run against the mutated build, and the mutant is caught when one
of them fails.  An anchor that is not found exactly once stops the run with "mutant X did not
apply", so the list cannot rot silently when the code it mutates changes: update the anchor.

    python3 tests/mutate/mutate.py              every mutant (make mutate)
    python3 tests/mutate/mutate.py --quick      the fast subset (ctest: mutate.quick)
    python3 tests/mutate/mutate.py --only read-gate-never-waits,no-wal-fsync-at-open
    python3 tests/mutate/mutate.py --list       the mutants and what each breaks

Not a mutant here: leaving out the directory fsyncs after the database and its WAL are created.
The crash test models directory entries (a name the directory's last fsync did not hold for that
file is gone after the cut), and such a mutant is still not caught, because it changes nothing:
SQLite itself fsyncs the WAL's header, and then the directory, at the first commit into a new WAL,
before anything can be answered from it.

Options: --work DIR keeps the scratch copy and its build there (reused by the next run, so only
what changed is rebuilt); --objects-from BUILD takes the object files of an up-to-date build of
this tree (CTest's and make mutate's: their own build tree) instead of compiling them again, each
one only when its compile flags are the scratch build's (-Werror aside) and it is newer than every
file its .o.d lists, so the scratch build compiles only the sources a mutant changes; --rounds N
power cuts per run of the crash test (which stops at the first round that fails); --repeat N runs
each mutant's tests N times (caught only if caught every time: how sure the catch is); --jobs N for
the build.
Exit status: 0 when every mutant applied, built and was caught; 1 otherwise.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

SQ = "lib/sqlite_commit.c"
PG = "lib/store_pg.c"
TMP = None  # the tests' TMPDIR, under the scratch directory
SUMMARY = ("rounds, seed", "keys answered", "answered by kind", "FAILED (seed")

# name, what it breaks, [(file, anchor, replacement)], tests that may catch it (in order), quick
MUTANTS = [
    (
        "async-told-at-commit",
        "the callbacks of idem_call_commit_async, _run_async, _begin_async and _complete_async "
        "(orderd's and idem-gateway's event-loop paths) are told at COMMIT, before the fsync",
        [(SQ,
          "    /* (a failed one too: its riders may have read batches that are not durable yet) */\n"
          "    b->rc = rc;\n",
          "    while (b->notices) { /* MUTANT: told at COMMIT */\n"
          "        struct sq_notice *n = b->notices;\n"
          "        b->notices = n->next;\n"
          "        if (rc < 0)\n"
          "            n->rc = rc;\n"
          "        n->next = g->notices;\n"
          "        g->notices = n;\n"
          "    }\n"
          "    b->rc = rc;\n")],
        ["power", "contract.sqlite"],
        True,
    ),
    (
        "async-told-before-commit",
        "an event loop's job (idem_call_run_async, _begin_async, _complete_async) is told as soon "
        "as it ran into the batch, before the batch's COMMIT",
        [(SQ,
          "                /* Its notice is told with the batch's; the job itself is spent. */\n"
          "                j->notice->next = g->batch->notices;\n"
          "                g->batch->notices = j->notice;\n",
          "                job_notify_locked(g, j); /* MUTANT: told before COMMIT */\n")],
        ["power", "contract.sqlite"],
        False,
    ),
    (
        "claim-forwarded-before-fsync",
        "idem-gateway's store steps -- a claim at a claim point, after which it forwards the "
        "request upstream, and a completion with no phase open (one-statement jobs of "
        "idem_call_begin_async and _complete_async) -- told once run into the batch, before its "
        "COMMIT and fsync",
        [(SQ,
          "            if (j->notice && j->rc == 0) {\n"
          "                /* Its notice is told with the batch's; the job itself is spent. */\n",
          "            if (j->notice && j->rc == 0 && (j->flags & IDEM__TX_ONE_STATEMENT)) {\n"
          "                job_notify_locked(g, j); /* MUTANT: a claim told before COMMIT */\n"
          "                g->members++;\n"
          "            } else if (j->notice && j->rc == 0) {\n"
          "                /* Its notice is told with the batch's; the job itself is spent. */\n")],
        ["power", "contract.sqlite"],
        False,
    ),
    (
        "answer-before-commit",
        "idem_tx_commit (and every blocking phase end) returns once its savepoint is released "
        "into the batch, before the batch's COMMIT and fsync",
        [(SQ,
          "    writer_release_locked(g);\n"
          "    batch_wait_locked(g, b);\n"
          "    rc = b->rc;\n"
          "    if (rc < 0)\n"
          "        idem__fmt(err, errlen, \"%s\", b->errmsg);\n"
          "    if (--b->refs == 0)\n"
          "        free(b);\n",
          "    writer_release_locked(g);\n"
          "    rc = 0; /* MUTANT: answered before COMMIT (the batch's reference is leaked) */\n")],
        ["power-cuts", "power", "contract.sqlite"],
        False,
    ),
    (
        "syncer-skips-fsync",
        "the syncer calls batches durable without its fsync of the WAL",
        [(SQ,
          "    if (rc == 0 && fdatasync(g->wal_fd) != 0) {\n",
          "    if (0) { /* MUTANT: no fsync */\n")],
        ["power-cuts", "power", "contract.sqlite"],
        False,
    ),
    (
        "no-wal-fsync-at-open",
        "a process that opens the store does not fsync the WAL that a killed process left "
        "(neither before SQLite opens it nor when the pipeline starts)",
        [(SQ,
          "        if (fd < 0 || fsync(fd) != 0) {\n",
          "        if (fd < 0 || (i != 0 && fsync(fd) != 0)) { /* MUTANT: not the -wal */\n"),
         (SQ,
          "    if (fdatasync(g->wal_fd) != 0 || (fsync(g->dir_fd) != 0 && errno != EINVAL))\n",
          "    if ((fsync(g->dir_fd) != 0 && errno != EINVAL)) /* MUTANT: no WAL fsync */\n")],
        ["power", "contract.sqlite"],
        True,
    ),
    (
        "read-gate-never-waits",
        "a read on a pooled connection answers without waiting for what it saw to be durable "
        "(only the stopped check kept)",
        [(SQ,
          "    if (atomic_load(&g->marks->durable) >= seen && !atomic_load(&g->stopped))\n",
          "    if (!atomic_load(&g->stopped)) /* MUTANT: never waits */\n")],
        ["power", "contract.sqlite"],
        True,
    ),
    (
        "fsync-failure-ignored",
        "a failed fsync does not stop the store (it goes on, and a later fsync vouches for pages "
        "the kernel may have dropped)",
        [(SQ,
          "    atomic_store(&g->stopped, 1);\n",
          "    (void)0; /* MUTANT: the store does not stop */\n")],
        ["power", "contract.sqlite"],
        True,
    ),
    (
        "pg-commit-result-ignored",
        "PostgreSQL: a transaction is answered as committed without looking at COMMIT's result",
        [(PG,
          "    rc = idem__pg_pipe_run(c, q, n, &failed);\n"
          "    if (q[0].ok) {\n",
          "    rc = idem__pg_pipe_run(c, q, n, &failed);\n"
          "    rc = 0; /* MUTANT: COMMIT's result ignored */\n"
          "    if (0) {\n")],
        ["contract.postgresql"],
        False,
    ),
]


def log(msg):
    print(msg, flush=True)


def tracked_files(src):
    try:
        out = subprocess.run(["git", "-C", src, "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        return [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(src):
            dirs[:] = [d for d in dirs if not d.startswith(("build", ".git"))]
            files += [os.path.relpath(os.path.join(root, n), src) for n in names]
        return files


def sync_tree(src, dst):
    """Copies the tree's files (as they are in the working tree) into dst, only those changed."""
    for rel in tracked_files(src):
        s, d = os.path.join(src, rel), os.path.join(dst, rel)
        if not os.path.isfile(s):
            continue
        with open(s, "rb") as f:
            data = f.read()
        try:
            with open(d, "rb") as f:
                if f.read() == data:
                    continue
        except OSError:
            pass
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copy2(s, d)


def object_dirs(build, targets):
    """The scratch build's CMakeFiles/<target>.dir directories of the targets."""
    want = {t + ".dir" for t in targets}
    for root, dirs, names in os.walk(build):
        dirs[:] = [d for d in dirs if d != "CMakeTmp"]
        if "flags.make" in names and os.path.basename(root) in want:
            yield root


def seed_objects(src, main_build, tree, build, targets):
    """Copies main_build's object files of the targets into the scratch build, so that make takes
    them as up to date there; returns how many. An object is taken only when the scratch build
    compiles it with the same flags.make (its paths aside; -Werror changes no object) and when it
    is newer than every dependency its .o.d names (its main build is up to date for it). Its .o.d
    comes along, its paths made the scratch copy's, so that a header changed later rebuilds it
    there too."""
    src, main_build = os.path.realpath(src), os.path.realpath(main_build)
    tree, build = os.path.realpath(tree), os.path.realpath(build)

    def scratch_path(path):
        for old, new in ((main_build, build), (src, tree)):
            if path == old or path.startswith(old + "/"):
                return new + path[len(old):]
        return path

    def flags(path, base_src, base_build):
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            return None
        text = text.replace(base_build, "@BUILD@").replace(base_src, "@SRC@")
        return text.replace(" -Werror", "")

    seeded = 0
    for sdir in object_dirs(build, targets):
        mdir = os.path.join(main_build, os.path.relpath(sdir, build))
        mflags = os.path.join(mdir, "flags.make")
        if not os.path.isfile(mflags) or flags(mflags, src, main_build) != flags(
                os.path.join(sdir, "flags.make"), tree, build):
            continue
        for root, _, names in os.walk(mdir):
            for dep in (n for n in names if n.endswith(".o.d")):
                mobj = os.path.join(root, dep[:-2])
                try:
                    with open(os.path.join(root, dep)) as f:
                        words = f.read().replace("\\\n", " ").split()
                    newest = max([os.path.getmtime(mflags)] +
                                 [os.path.getmtime(w) for w in words if not w.endswith(":")])
                    fresh = os.path.getmtime(mobj) >= newest
                except (OSError, ValueError):
                    fresh = False
                if not fresh:
                    continue
                sobj = os.path.join(sdir, os.path.relpath(mobj, mdir))
                os.makedirs(os.path.dirname(sobj), exist_ok=True)
                with open(sobj + ".d", "w") as f:
                    f.write(" ".join(w if w.endswith(":") else scratch_path(w) for w in words))
                    f.write("\n")
                shutil.copyfile(mobj, sobj)  # its time is now: newer than the scratch sources
                seeded += 1
    return seeded


def check_anchors(tree, mutants):
    """Every anchor found exactly once, or the run stops: the list must not rot silently."""
    bad = []
    for name, _, subs, _, _ in mutants:
        for path, anchor, _ in subs:
            with open(os.path.join(tree, path)) as f:
                n = f.read().count(anchor)
            if n != 1:
                bad.append(f"mutant {name} did not apply: its anchor is found {n} times in {path} "
                           f"(want 1):\n{anchor}")
    return bad


def run(cmd, cwd, timeout, env=None):
    t0 = time.monotonic()
    if env is None and TMP:
        # A failing crash test keeps its files: in the scratch directory, removed after each run.
        shutil.rmtree(TMP, ignore_errors=True)
        os.makedirs(TMP, exist_ok=True)
        env = dict(os.environ, TMPDIR=TMP)
    try:
        p = subprocess.run(cmd, cwd=cwd, timeout=timeout, capture_output=True, env=env)
        rc, out = p.returncode, (p.stdout + p.stderr).decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = ((e.stdout or b"") + (e.stderr or b"")).decode(errors="replace")
    return rc, out, time.monotonic() - t0


def test_command(test, tree, build, rounds):
    if test in ("power", "power-cuts"):
        return [os.path.join(build, "bin", "test_power_loss"), "--rounds", str(rounds),
                "--fail-fast"] + (["--cuts-only"] if test == "power-cuts" else []), 300
    if test == "contract.sqlite":
        return [os.path.join(build, "bin", "store_contract"), "sqlite"], 300
    if test == "contract.postgresql":
        return ["sh", os.path.join(tree, "tests", "pg", "with_pg.sh"),
                os.path.join(build, "bin", "store_contract"), "postgresql"], 300
    raise SystemExit(f"unknown test {test}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the fast subset only")
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--work", help="scratch directory (kept, reused); default: a temporary one")
    ap.add_argument("--objects-from", metavar="BUILD",
                    help="an up-to-date build of this tree whose object files the scratch build "
                    "takes instead of compiling them again")
    ap.add_argument("--rounds", type=int, default=24, help="power cuts per crash-test run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each mutant's tests N times: caught only if caught every time")
    args = ap.parse_args()

    mutants = MUTANTS
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n not in {m[0] for m in MUTANTS}]
        if unknown:
            raise SystemExit(f"mutate: no mutant named {', '.join(unknown)}")
        mutants = [m for m in MUTANTS if m[0] in names]
    elif args.quick:
        mutants = [m for m in MUTANTS if m[4]]
    if args.list:
        for name, what, _, tests, quick in MUTANTS:
            log(f"{name}{' (quick)' if quick else ''}: {what} [{', '.join(tests)}]")
        return 0

    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="idem-mutate-")
    tree, build = os.path.join(work, "src"), os.path.join(work, "build")
    global TMP
    TMP = os.path.join(work, "tmp")
    os.makedirs(tree, exist_ok=True)
    t_start = time.monotonic()
    sync_tree(src, tree)
    problems = check_anchors(tree, mutants)
    if problems:
        for p in problems:
            log(p)
        return 1

    targets = ["test_power_loss", "store_contract"]
    rc, out, _ = run(["cmake", "-S", tree, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                     tree, 600)
    if rc != 0:
        log(out)
        log("mutate: cannot configure the scratch copy")
        return 1

    def build_targets():
        return run(["cmake", "--build", build, "-j", str(args.jobs), "--target"] + targets,
                   tree, 1200)

    seeded = 0
    if args.objects_from:
        # libidem's objects (idem_static is an archive of idem_objects') and the tests' own
        seeded = seed_objects(src, args.objects_from, tree, build, targets + ["idem_objects"])
    rc, out, took = build_targets()
    if rc != 0:
        log(out[-4000:])
        log("mutate: the scratch copy does not build unmutated")
        return 1
    log(f"mutate: scratch copy in {work}, built in {took:.0f} s"
        + (f" ({seeded} object files taken from {args.objects_from})" if seeded else ""))
    # The tests must pass unmutated, or every mutant would be "caught" by a broken test.
    needed = sorted({t for m in mutants for t in m[3]})
    for test in needed:
        cmd, timeout = test_command(test, tree, build, args.rounds)
        rc, out, took = run(cmd, tree, timeout)
        if rc != 0:
            log(out[-4000:])
            log(f"mutate: {test} fails without any mutant ({rc}); nothing can be judged")
            return 1
        log(f"mutate: unmutated, {test} passes ({took:.1f} s)")

    results, failed = [], 0
    for name, what, subs, tests, _ in mutants:
        pristine = {}
        for path, _, _ in subs:
            with open(os.path.join(tree, path)) as f:
                pristine.setdefault(path, f.read())
        mutated = dict(pristine)
        for path, anchor, repl in subs:
            mutated[path] = mutated[path].replace(anchor, repl, 1)
        try:
            for path, text in mutated.items():
                with open(os.path.join(tree, path), "w") as f:
                    f.write(text)
            rc, out, t_build = build_targets()
            if rc != 0:
                log(out[-4000:])
                log(f"mutant {name} did not build")
                results.append((name, "DID NOT BUILD", "", t_build, 0.0))
                failed += 1
                continue
            caught, by, t_test = 0, "", 0.0
            for _ in range(args.repeat):
                for test in tests:
                    cmd, timeout = test_command(test, tree, build, args.rounds)
                    rc, out, took = run(cmd, tree, timeout)
                    t_test += took
                    if rc != 0:
                        caught += 1
                        by = test + (" (timeout)" if rc == "timeout" else "")
                        first = [ln for ln in out.splitlines()
                                 if ("test_power_loss: " in ln or "FAIL" in ln) and
                                 not any(w in ln for w in SUMMARY)][:2]
                        for ln in first:
                            log(f"    {name}: {ln[:160]}")
                        break
            verdict = "caught" if caught == args.repeat else "MISSED"
            if args.repeat > 1:
                verdict += f" {caught}/{args.repeat}"
            if caught < args.repeat:
                failed += 1
            t_test /= args.repeat
            results.append((name, verdict, by, t_build, t_test))
            log(f"mutant {name}: {verdict}{' by ' + by if by else ''} "
                f"(build {t_build:.0f} s, tests {t_test:.1f} s{' a run' if args.repeat > 1 else ''})")
        finally:
            for path, text in pristine.items():
                with open(os.path.join(tree, path), "w") as f:
                    f.write(text)

    log("")
    log(f"{'mutant':<28} {'verdict':<14} {'by':<22} {'build s':>7} {'tests s':>8}")
    for name, verdict, by, tb, tt in results:
        log(f"{name:<28} {verdict:<14} {by:<22} {tb:>7.0f} {tt:>8.1f}")
    log(f"mutate: {len(results) - failed} of {len(results)} mutants caught, "
        f"{time.monotonic() - t_start:.0f} s in all")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
