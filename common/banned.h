/* SPDX-License-Identifier: Apache-2.0 */
/*
 * banned.h - functions no part of idem may call (after git's banned.h): libidem, libidem-client,
 * orderd, provider-sim and the idem CLI all compile against this one list.  Each entry either
 * writes past a buffer without a bound or keeps hidden global state (rand() among them: jitter
 * and ids come from a generator held in a handle, or from the CSPRNG); each has a bounded or
 * re-entrant sibling.  Include it last, after the system headers.
 */
#ifndef IDEM_BANNED_H
#define IDEM_BANNED_H

#define BANNED(func) sorry_##func##_is_a_banned_function

#undef strcpy
#define strcpy(x, y) BANNED(strcpy)
#undef strcat
#define strcat(x, y) BANNED(strcat)
#undef strncpy
#define strncpy(x, y, n) BANNED(strncpy)
#undef strncat
#define strncat(x, y, n) BANNED(strncat)
#undef sprintf
#define sprintf(...) BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) BANNED(vsprintf)
#undef strtok
#define strtok(x, y) BANNED(strtok)
/* They follow the locale: header names and keywords compare with ascii.h's ascii_caseeq. */
#undef strcasecmp
#define strcasecmp(x, y) BANNED(strcasecmp)
#undef strncasecmp
#define strncasecmp(x, y, n) BANNED(strncasecmp)
#undef gmtime
#define gmtime(t) BANNED(gmtime)
#undef localtime
#define localtime(t) BANNED(localtime)
#undef rand
#define rand() BANNED(rand)
#undef srand
#define srand(s) BANNED(srand)

#endif /* IDEM_BANNED_H */
