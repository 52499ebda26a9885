/* SPDX-License-Identifier: Apache-2.0 */
/*
 * flag_file.h - a program's long options read from a YAML file, for a service's config in /etc:
 * one `name: value` per option, `listen: 127.0.0.1:8080` standing for --listen 127.0.0.1:8080.
 * The same format as idem-gateway's config (YAML, read with libyaml), flat.  The options come out
 * as "--name=value" arguments to put before the command line's own, so a flag given there wins.
 * Part of idem_util (src/util/).
 */
#ifndef IDEM_UTIL_FLAG_FILE_H
#define IDEM_UTIL_FLAG_FILE_H

#include <getopt.h>
#include <stddef.h>

/*
 * Reads `path`: an empty file, or a mapping of option names (those of `known` that take a
 * value; not `exclude`, which may be NULL) to scalar values.  Returns 0 with *args (new, free
 * with flag_file_free) holding *nargs "--name=value" strings in the file's order, or -1 with one
 * line in `err` naming the file and, where it applies, the line: an unreadable file, YAML that
 * does not parse, an unknown or repeated name, a list or mapping as a value, an alias.
 */
int flag_file_load(const char *path, const struct option *known, const char *exclude, char ***args,
                   int *nargs, char *err, size_t errlen);
void flag_file_free(char **args, int nargs);

#endif /* IDEM_UTIL_FLAG_FILE_H */
