/* main.c - the tilewise command line (placeholder until the run driver lands). */
#include <stdio.h>

int main(void)
{
    fprintf(stderr, "tilewise: not built yet\n");
    return 1;
}
