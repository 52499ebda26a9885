# SPDX-License-Identifier: Apache-2.0
"""
test_deb.py - the Debian packages of `make deb` (packaging/deb.cmake).

CPack makes them from the build tree into a scratch directory, then:

  - the six packages are there, with their sections, dependencies and conffiles; lintian finds
    no error in them;
  - every file a plain `cmake --install` installs is in one of them (gzip'd for manual pages),
    so a new program, header or page cannot be left out of the packages unnoticed;
  - dpkg installs all six into a scratch root (`dpkg --root`, maintainer scripts run chrootless:
    they make the system users in that root and leave the host's systemd alone); from the files
    installed there `orderd --version` runs, `pkg-config --cflags idem` names the installed
    headers, examples/embed.c builds against the installed library and replays, `man orderd`
    finds its page, a CMake project finds the libraries with find_package(idem CONFIG) and links
    them shared and static; removing orderd keeps its conffiles /etc/idem/orderd.{conf,env}, purging
    removes it.

What it cannot check here: the unit started by dpkg under systemd (no systemd as PID 1 on this
machine; tests/ops/test_systemd.py covers the unit as far as it can).  IDEM_BUILD is the build
tree.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "service"))

from harness import TestFailure, expect, expect_eq, fail, run, test  # noqa: E402

BUILD = os.environ.get("IDEM_BUILD") or os.path.join(REPO, "build")
PACKAGES = {
    # package: (section, what it must hold, what its Depends must name)
    "libidem0": ("libs", [r"usr/lib/[^/]+/libidem\.so\.0$"], ["libjansson4", "libsqlite3-0"]),
    "libidem-client0": ("libs", [r"usr/lib/[^/]+/libidem-client\.so\.0$"], ["libcurl4"]),
    "libidem-dev": ("libdevel", [r"usr/include/idem/idem\.h$", r"usr/include/idem/client\.h$",
                                 r"usr/lib/[^/]+/pkgconfig/idem\.pc$", r"usr/lib/[^/]+/libidem\.a$",
                                 r"usr/lib/[^/]+/libidem\.so$",
                                 r"usr/lib/[^/]+/cmake/idem/idemConfig\.cmake$"],
                    ["libidem0 (= ", "libidem-client0 (= ", "libjansson-dev"]),
    "idem-tools": ("utils", [r"usr/bin/idem$", r"usr/bin/idem-check$", r"usr/bin/provider-sim$",
                             r"usr/share/man/man1/idem\.1\.gz$"], ["libcurl4"]),
    "orderd": ("net", [r"usr/bin/orderd$", r"usr/share/man/man8/orderd\.8\.gz$",
                       r"lib/systemd/system/orderd\.service$", r"etc/idem/orderd\.env$",
                       r"usr/lib/sysusers\.d/orderd\.conf$", r"usr/share/doc/orderd/openapi\.yaml$",
                       r"usr/share/doc/orderd/ops/alerts\.yml$"], ["adduser", "libuv1"]),
    "idem-gateway": ("net", [r"usr/bin/idem-gateway$", r"usr/share/man/man8/idem-gateway\.8\.gz$",
                             r"lib/systemd/system/idem-gateway\.service$",
                             r"etc/idem/gateway\.yaml$"], ["adduser", "libyaml-0-2"]),
}


class Ctx:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="idem-deb-")
        self.out = os.path.join(self.tmp, "debs")
        config = os.path.join(BUILD, "CPackConfig.cmake")
        if not os.path.exists(config):
            raise TestFailure("no %s: configure the build first" % config)
        p = subprocess.run(["cpack", "--config", config, "-B", self.out], capture_output=True,
                           text=True, timeout=300)
        if p.returncode != 0:
            raise TestFailure("cpack failed:\n%s%s" % (p.stdout[-3000:], p.stderr[-3000:]))
        self.debs = {}
        for path in glob.glob(os.path.join(self.out, "*.deb")):
            name = subprocess.run(["dpkg-deb", "-f", path, "Package"], capture_output=True,
                                  text=True, check=True).stdout.strip()
            self.debs[name] = path
        self.root = os.path.join(self.tmp, "root")

    def files(self, package):
        out = subprocess.run(["dpkg-deb", "-c", self.debs[package]], capture_output=True,
                             text=True, check=True).stdout
        return [line.split()[5].lstrip("./") for line in out.splitlines()
                if not line.startswith("d")]

    def field(self, package, name):
        return subprocess.run(["dpkg-deb", "-f", self.debs[package], name], capture_output=True,
                              text=True, check=True).stdout.strip()

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


@test
def deb_packages_are_made_with_what_they_should_hold(ctx):
    expect_eq(sorted(ctx.debs), sorted(PACKAGES), "packages cpack made")
    for name, (section, holds, depends) in PACKAGES.items():
        files = ctx.files(name)
        expect_eq(ctx.field(name, "Section"), section, name + ": Section")
        expect(re.fullmatch(r"\d+\.\d+\.\d+-\d+", ctx.field(name, "Version")),
               "%s: Version %r" % (name, ctx.field(name, "Version")))
        for pattern in holds + [r"usr/share/doc/%s/copyright$" % re.escape(name),
                                r"usr/share/doc/%s/changelog\.Debian\.gz$" % re.escape(name)]:
            expect(any(re.search(pattern, f) for f in files),
                   "%s holds nothing like %s: %s" % (name, pattern, files))
        dep = ctx.field(name, "Depends")
        for d in depends:
            expect(d in dep, "%s: Depends %r lacks %r" % (name, dep, d))
        for f in files:
            expect(not f.startswith("usr/local/"), "%s installs into /usr/local: %s" % (name, f))
            if "/man/" in f:
                expect(f.endswith(".gz"), "%s: manual page not compressed: %s" % (name, f))


@test
def deb_packages_have_no_lintian_error(ctx):
    p = subprocess.run(["lintian", "--fail-on", "error", "--no-tag-display-limit"] +
                       sorted(ctx.debs.values()), capture_output=True, text=True, timeout=300)
    errors = [line for line in (p.stdout + p.stderr).splitlines() if line.startswith("E:")]
    if p.returncode != 0 or errors:
        fail("lintian (exit %d):\n%s" % (p.returncode, p.stdout + p.stderr))


@test
def deb_packages_hold_everything_cmake_install_installs(ctx):
    prefix = os.path.join(ctx.tmp, "plain")
    p = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], capture_output=True,
                       text=True, timeout=120)
    expect(p.returncode == 0, "cmake --install: %s%s" % (p.stdout, p.stderr))
    packaged = {os.path.basename(f) for name in ctx.debs for f in ctx.files(name)}
    missing = []
    for dirpath, _, names in os.walk(prefix):
        for n in names:
            if n not in packaged and n + ".gz" not in packaged:
                missing.append(os.path.relpath(os.path.join(dirpath, n), prefix))
    if missing:
        fail("cmake --install installs what no package holds (packaging/deb.cmake):\n  " +
             "\n  ".join(sorted(missing)))


def dpkg(ctx, *args):
    return subprocess.run(["dpkg", "--root=" + ctx.root, "--force-script-chrootless"] +
                          list(args), capture_output=True, text=True, timeout=120)


@test
def deb_packages_install_into_a_root_and_work_from_there(ctx):
    root = ctx.root
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "etc"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for f in ("status", "available"):
        open(os.path.join(root, "var/lib/dpkg", f), "w").close()
    # The scratch root has none of the system's packages: their dependencies are the host's.
    p = dpkg(ctx, "--force-depends", "-i", *sorted(ctx.debs.values()))
    expect(p.returncode == 0, "dpkg -i: %s%s" % (p.stdout, p.stderr))
    for name in PACKAGES:
        st = dpkg(ctx, "-s", name).stdout
        expect("Status: install ok installed" in st, "%s is not installed: %s" % (name, st))
    # The postinsts made the system users in that root, and nowhere else.
    with open(os.path.join(root, "etc", "passwd")) as f:
        users = {line.split(":")[0] for line in f}
    expect({"orderd", "idem-gateway"} <= users, "users made in the root: %s" % sorted(users))

    v = subprocess.run([os.path.join(root, "usr/bin/orderd"), "--version"], capture_output=True,
                       text=True, timeout=30)
    expect(v.returncode == 0 and v.stdout.startswith("orderd 0."), "orderd --version: %r %r" % (
        v.stdout, v.stderr))

    arch = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True,
                          text=True).stdout.strip() or "x86_64-linux-gnu"
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(root, "usr/lib", arch, "pkgconfig"))
    c = subprocess.run(["pkg-config", "--cflags", "idem"], capture_output=True, text=True,
                       env=env, timeout=30)
    expect(c.returncode == 0, "pkg-config --cflags idem: %s" % c.stderr)
    incs = [os.path.realpath(w[2:]) for w in c.stdout.split() if w.startswith("-I")]
    expect_eq(incs, [os.path.realpath(os.path.join(root, "usr/include"))],
              "pkg-config --cflags idem (%r)" % c.stdout)

    # A user's program, built and linked with what the packages installed only.
    libs = subprocess.run(["pkg-config", "--libs", "idem"], capture_output=True, text=True,
                          env=env).stdout.split()
    exe = os.path.join(ctx.tmp, "embed")
    libdir = os.path.join(root, "usr/lib", arch)
    b = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror",
                        os.path.join(REPO, "examples", "embed.c"), "-o", exe] + c.stdout.split() +
                       libs + ["-Wl,-rpath," + libdir], capture_output=True, text=True, timeout=120)
    expect(b.returncode == 0, "building examples/embed.c against the packages: %s" % b.stderr)
    db = "sqlite:" + os.path.join(ctx.tmp, "embed.db")
    first = subprocess.run([exe, db], capture_output=True, text=True, timeout=30).stdout
    second = subprocess.run([exe, db], capture_output=True, text=True, timeout=30).stdout
    expect("executed: 201" in first and "replayed: 201" in second,
           "examples/embed.c with the packaged libidem: %r then %r" % (first, second))
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    expect(os.path.join(libdir, "libidem.so.0") in ldd, "embed did not load the packaged "
           "libidem.so.0: %s" % ldd)

    # The same program through find_package(idem CONFIG), shared and static.
    proj = os.path.join(ctx.tmp, "consumer")
    os.makedirs(proj, exist_ok=True)
    with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
        f.write("cmake_minimum_required(VERSION 3.20)\nproject(consumer C)\n"
                "find_package(idem 0.1 CONFIG REQUIRED)\n"
                "add_executable(embed %s)\ntarget_link_libraries(embed PRIVATE idem::idem)\n"
                "add_executable(embed_static %s)\n"
                "target_link_libraries(embed_static PRIVATE idem::idem_static)\n" % (
                    os.path.join(REPO, "examples", "embed.c"),
                    os.path.join(REPO, "examples", "embed.c")))
    cb = os.path.join(proj, "build")
    for cmd in (["cmake", "-S", proj, "-B", cb, "-DCMAKE_PREFIX_PATH=" + os.path.join(root, "usr"),
                 "-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF"],
                ["cmake", "--build", cb]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        expect(r.returncode == 0, "%s: %s%s" % (" ".join(cmd), r.stdout[-2000:], r.stderr[-2000:]))
    with open(os.path.join(cb, "CMakeCache.txt")) as f:
        where = [line for line in f if line.startswith("idem_DIR:")]
    expect(where and os.path.join(root, "usr/lib", arch, "cmake/idem") in where[0],
           "find_package(idem) found another idem: %s" % where)
    for name in ("embed", "embed_static"):
        db = "sqlite:" + os.path.join(ctx.tmp, "cmake-" + name + ".db")
        outs = [subprocess.run([os.path.join(cb, name), db], capture_output=True, text=True,
                               timeout=30).stdout for _ in range(2)]
        expect("executed: 201" in outs[0] and "replayed: 201" in outs[1],
               "%s built with find_package(idem): %r" % (name, outs))

    m = subprocess.run(["man", "orderd"], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, MANPATH=os.path.join(root, "usr/share/man"),
                                MANWIDTH="80"))
    expect(m.stdout.startswith("ORDERD(8)"), "man orderd from the package: %r" % m.stdout[:200])

    # Removing keeps the conffile (an operator's settings and secret); purging removes it.
    env_file = os.path.join(root, "etc/idem/orderd.env")
    conf_file = os.path.join(root, "etc/idem/orderd.conf")
    expect(dpkg(ctx, "-r", "orderd").returncode == 0, "dpkg -r orderd")
    expect(not os.path.exists(os.path.join(root, "usr/bin/orderd")), "orderd left after -r")
    for f in (env_file, conf_file):
        expect(os.path.exists(f), "dpkg -r orderd removed its conffile %s" % f)
    expect(dpkg(ctx, "-P", "orderd").returncode == 0, "dpkg -P orderd")
    for f in (env_file, conf_file):
        expect(not os.path.exists(f), "dpkg -P orderd kept %s" % f)


if __name__ == "__main__":
    run("test_deb", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
