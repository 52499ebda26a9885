# SPDX-License-Identifier: Apache-2.0
"""
tls_ca.py - a throw-away certificate authority for the TLS tests, made with the `openssl` command
in a directory the test owns: a CA, and certificates it (or a second, untrusted CA) signs for
loopback servers and clients.  Nothing here is ever trusted outside the test's directory.

    ca = TlsCa(tmpdir)
    srv = ca.server("srv")                         # for 127.0.0.1, ::1 and localhost
    bad = ca.server("other", hosts=["example.org"])  # a name the client does not ask for
    old = ca.server("old", expired=True)           # valid in 2000, long expired
    rogue = TlsCa(tmpdir, name="rogue").server("rogue")  # signed by a CA the client does not trust
    cli = ca.client("caller")                      # for mutual TLS
    srv.cert, srv.key, srv.chain, ca.cert           # file paths (chain: leaf + CA)

The authority's own files are ca.key and ca.crt in tls-<name>/ of the directory; a leaf's are
<leaf>.key, <leaf>.crt and <leaf>.chain.pem beside them.

Keys are ECDSA P-256 unless rsa=True.  Each call writes new files, so a test may rotate a
certificate (SIGHUP) by asking for another one under a new name.
"""

import os
import subprocess


class Issued:
    def __init__(self, cert, key, chain):
        self.cert, self.key, self.chain = cert, key, chain


class TlsCa:
    def __init__(self, directory, name="test-ca"):
        self.dir = os.path.join(directory, "tls-" + name)
        os.makedirs(self.dir, exist_ok=True)
        self.name = name
        self.key = self._path("ca.key")
        self.cert = self._path("ca.crt")
        self._serial = 1
        self._genkey(self.key, rsa=False)
        self._run(["req", "-x509", "-new", "-key", self.key, "-out", self.cert, "-days", "2",
                   "-subj", "/CN=" + name, "-sha256",
                   "-addext", "basicConstraints=critical,CA:TRUE",
                   "-addext", "keyUsage=critical,keyCertSign,cRLSign"])

    def _path(self, name):
        return os.path.join(self.dir, name)

    def _run(self, args):
        r = subprocess.run(["openssl"] + args, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("openssl %s failed: %s" % (args[0], r.stderr.strip()))

    def _genkey(self, path, rsa):
        if rsa:
            self._run(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                       "-out", path])
        else:
            self._run(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                       "-out", path])
        os.chmod(path, 0o600)

    def _issue(self, name, cn, ext, expired, rsa):
        if name == "ca":
            raise ValueError("'ca' names the authority's own files")
        key, csr = self._path(name + ".key"), self._path(name + ".csr")
        cert, chain, extfile = (self._path(name + ".crt"), self._path(name + ".chain.pem"),
                                self._path(name + ".ext"))
        self._genkey(key, rsa)
        self._run(["req", "-new", "-key", key, "-out", csr, "-subj", "/CN=" + cn])
        with open(extfile, "w") as f:
            f.write(ext)
        self._serial += 1
        args = ["x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key,
                "-set_serial", str(self._serial), "-out", cert, "-sha256", "-extfile", extfile]
        if expired:
            # `openssl x509` (3.0) cannot date a certificate in the past; `openssl ca` can.
            db, serial = self._path("index.txt"), self._path("serial")
            open(db, "a").close()
            with open(serial, "w") as f:
                f.write("%04X\n" % (1000 + self._serial))
            conf = self._path(name + ".cnf")
            with open(conf, "w") as f:
                f.write("[ca]\ndefault_ca = c\n[c]\ndatabase = %s\nserial = %s\nnew_certs_dir = %s\n"
                        "default_md = sha256\npolicy = p\nunique_subject = no\n"
                        "[p]\ncommonName = supplied\n" % (db, serial, self.dir))
            args = ["ca", "-batch", "-config", conf, "-in", csr, "-cert", self.cert,
                    "-keyfile", self.key, "-out", cert, "-extfile", extfile, "-notext",
                    "-startdate", "20000101000000Z", "-enddate", "20000102000000Z"]
        self._run(args)
        with open(chain, "w") as out:
            for p in (cert, self.cert):
                with open(p) as f:
                    out.write(f.read())
        return Issued(cert, key, chain)

    def server(self, name, hosts=("127.0.0.1", "::1", "localhost"), expired=False, rsa=False):
        sans = ",".join(("IP:" if h[0].isdigit() or ":" in h else "DNS:") + h for h in hosts)
        ext = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
               "extendedKeyUsage=serverAuth\nsubjectAltName=%s\n" % sans)
        return self._issue(name, hosts[0], ext, expired, rsa)

    def client(self, name, rsa=False):
        ext = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
               "extendedKeyUsage=clientAuth\n")
        return self._issue(name, name, ext, False, rsa)
