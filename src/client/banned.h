/*
 * banned.h - functions libidem-client must not call: the list of lib/banned.h (after git's).
 * They either write past a buffer without a bound, or keep hidden global state (rand() among
 * them: jitter comes from the generator in the client handle); each has a bounded or re-entrant
 * sibling.  The client library does not include libidem's private headers, so it keeps its own
 * copy.  Include it last, after the system headers.
 */
#ifndef IDEM_CLIENT_BANNED_H
#define IDEM_CLIENT_BANNED_H

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
#undef gmtime
#define gmtime(t) BANNED(gmtime)
#undef localtime
#define localtime(t) BANNED(localtime)

#undef rand
#define rand() BANNED(rand)
#undef srand
#define srand(s) BANNED(srand)

#endif /* IDEM_CLIENT_BANNED_H */
