/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tls_fixture.h - certificates made in memory with OpenSSL for the TLS engine's unit test and
 * fuzzer (no openssl command, no files in the tree): a CA, a P-256 leaf it signed for
 * "localhost" and 127.0.0.1, written as PEM files into a directory the caller made.
 */
#ifndef IDEM_TESTS_TLS_FIXTURE_H
#define IDEM_TESTS_TLS_FIXTURE_H

#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

static int fixture_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX v3;
    X509_EXTENSION *ext;
    int ok;

    X509V3_set_ctx(&v3, issuer, cert, NULL, NULL, 0);
    ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
    if (ext == NULL)
        return -1;
    ok = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok == 1 ? 0 : -1;
}

/* A certificate for `cn` with `key`, signed by issuer/ikey (NULL: itself); NULL on failure. */
static X509 *fixture_cert(const char *cn, EVP_PKEY *key, X509 *issuer, EVP_PKEY *ikey, int ca,
                          long not_after_days)
{
    X509 *cert = X509_new();
    X509_NAME *name = X509_NAME_new();
    static long serial = 1;

    if (cert == NULL || name == NULL)
        goto fail;
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600L * 24 * 2);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600L * 24 * not_after_days);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_subject_name(cert, name);
    X509_set_issuer_name(cert, issuer ? X509_get_subject_name(issuer) : name);
    X509_set_pubkey(cert, key);
    if (ca ? fixture_ext(cert, issuer ? issuer : cert, NID_basic_constraints, "critical,CA:TRUE") ||
                 fixture_ext(cert, issuer ? issuer : cert, NID_key_usage,
                             "critical,keyCertSign,cRLSign")
           : fixture_ext(cert, issuer, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"))
        goto fail;
    if (X509_sign(cert, ikey ? ikey : key, EVP_sha256()) <= 0)
        goto fail;
    X509_NAME_free(name);
    return cert;
fail:
    X509_NAME_free(name);
    X509_free(cert);
    return NULL;
}

static int fixture_write(const char *dir, const char *file, X509 *cert, EVP_PKEY *key)
{
    char path[512];
    FILE *f;
    int ok;

    snprintf(path, sizeof path, "%s/%s", dir, file);
    f = fopen(path, "w");
    if (f == NULL)
        return -1;
    ok = cert ? PEM_write_X509(f, cert) : PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL);
    return fclose(f) == 0 && ok == 1 ? 0 : -1;
}

/*
 * Writes into `dir`: ca.pem (the CA), leaf.pem + leaf.key (signed by it, for localhost and
 * 127.0.0.1, valid), expired.pem + expired.key (the same, expired), other-ca.pem (a CA that
 * signed nothing).  0, or -1.
 */
static int fixture_make(const char *dir)
{
    EVP_PKEY *cakey = EVP_EC_gen("P-256"), *key = EVP_EC_gen("P-256");
    EVP_PKEY *okey = EVP_EC_gen("P-256");
    X509 *ca = NULL, *leaf = NULL, *expired = NULL, *other = NULL;
    int rc = -1;

    if (cakey == NULL || key == NULL || okey == NULL)
        goto out;
    ca = fixture_cert("idem test CA", cakey, NULL, NULL, 1, 30);
    other = fixture_cert("idem other CA", okey, NULL, NULL, 1, 30);
    if (ca == NULL || other == NULL)
        goto out;
    leaf = fixture_cert("localhost", key, ca, cakey, 0, 30);
    expired = fixture_cert("localhost", key, ca, cakey, 0, -1);
    if (leaf == NULL || expired == NULL)
        goto out;
    if (fixture_write(dir, "ca.pem", ca, NULL) || fixture_write(dir, "other-ca.pem", other, NULL) ||
        fixture_write(dir, "leaf.pem", leaf, NULL) || fixture_write(dir, "leaf.key", NULL, key) ||
        fixture_write(dir, "expired.pem", expired, NULL) ||
        fixture_write(dir, "expired.key", NULL, key))
        goto out;
    rc = 0;
out:
    X509_free(ca);
    X509_free(other);
    X509_free(leaf);
    X509_free(expired);
    EVP_PKEY_free(cakey);
    EVP_PKEY_free(key);
    EVP_PKEY_free(okey);
    return rc;
}

#endif /* IDEM_TESTS_TLS_FIXTURE_H */
