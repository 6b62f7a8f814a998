/* datetime.c - see datetime.h */
#include "core/datetime.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static bool digits(const char *s, int n, int *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return false;
        *v = *v * 10 + (s[i] - '0');
    }
    return true;
}

bool tw_rfc3339_check(const char *s, char *why, size_t why_size)
{
#define BAD(...)                                                                                   \
    do {                                                                                           \
        if (why_size) snprintf(why, why_size, __VA_ARGS__);                                        \
        return false;                                                                              \
    } while (0)
    int y, mo, d, h, mi, se;
    size_t n = strlen(s);
    if (n < 20) BAD("too short (expected YYYY-MM-DDTHH:MM:SS and Z or an offset)");
    if (!digits(s, 4, &y) || s[4] != '-' || !digits(s + 5, 2, &mo) || s[7] != '-' ||
        !digits(s + 8, 2, &d))
        BAD("the date is not YYYY-MM-DD");
    if (s[10] != 'T' && s[10] != 't') BAD("no 'T' between the date and the time");
    if (!digits(s + 11, 2, &h) || s[13] != ':' || !digits(s + 14, 2, &mi) || s[16] != ':' ||
        !digits(s + 17, 2, &se))
        BAD("the time is not HH:MM:SS");
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (mo < 1 || mo > 12) BAD("month %d is not 1..12", mo);
    if (d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap))
        BAD("day %d does not exist in %04d-%02d", d, y, mo);
    if (h > 23 || mi > 59 || se > 60) BAD("%02d:%02d:%02d is not a time of day", h, mi, se);
    const char *z = s + 19;
    if (*z == '.') {
        z++;
        if (!isdigit((unsigned char)*z)) BAD("no digits after the decimal point");
        while (isdigit((unsigned char)*z)) z++;
    }
    if ((*z == 'Z' || *z == 'z') && z[1] == '\0') return true;
    int oh, om;
    if ((*z == '+' || *z == '-') && digits(z + 1, 2, &oh) && z[3] == ':' && digits(z + 4, 2, &om) &&
        z[6] == '\0') {
        if (oh > 23 || om > 59) BAD("the offset %.6s is out of range", z);
        return true;
    }
    BAD("no time zone at the end (Z, or an offset such as +02:00)");
#undef BAD
}
