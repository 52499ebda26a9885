/*
 * banned.h - functions provider-sim must not call, the same list as libidem's lib/banned.h (after
 * git's).  They write past a buffer without a bound or keep hidden global state; each has a
 * bounded or re-entrant sibling.  A program does not include the library's private headers, so
 * it keeps its own copy.  Include it last, after the system headers.
 */
#ifndef SIM_BANNED_H
#define SIM_BANNED_H

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

#endif /* SIM_BANNED_H */
