/* test_parts.c - crash-safe output (pipeline/store/parts.c, assemble.c): committed chunks are
 * found again by a later open (resume), across shards; a chunk whose bytes
 * changed (checksum), whose journal line was cut short by a crash, or that
 * was aborted is not counted; assembly refuses an unfinished grid naming the
 * rows, and counts the argmax of what was committed. A checkpoint commits the
 * finished rows, keeps the unfinished row's tile records with the saved sums,
 * gives them back bit for bit to the next open, and stops counting once its
 * row is committed or its bytes change. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipeline/store/assemble.h"
#include "pipeline/store/parts.h"
#include "testutil.h"

#define GW 5
#define GH 6
#define NC 3

static tw_parts_params params(const char *dir, int shard, int count)
{
    return (tw_parts_params){.out_dir = dir,
                             .stem = "scene",
                             .fingerprint = "fp 1\n",
                             .grid_w = GW,
                             .grid_h = GH,
                             .n_classes = NC,
                             .shard_index = shard,
                             .shard_count = count};
}

static tw_parts *open_parts(const tw_parts_params *p)
{
    tw_error err;
    tw_error_init(&err);
    tw_parts *pt = NULL;
    if (tw_parts_open(p, true, &pt, &err) != TW_OK) fail_msg("open: %s", err.msg);
    return pt;
}

/* Row r, cell c: class (r + c) % NC wins with 0.6; the last cell of row 2
 * has no tile (nodata). */
static void fill_rows(int r0, int n, float *probs, uint8_t *has)
{
    for (int r = 0; r < n; r++)
        for (int c = 0; c < GW; c++) {
            int win = (r0 + r + c) % NC;
            for (int k = 0; k < NC; k++)
                probs[((size_t)r * GW + c) * NC + k] = k == win ? 0.6f : 0.2f;
            has[r * GW + c] = !(r0 + r == 2 && c == GW - 1);
        }
}

static void commit(tw_parts *pt, int r0, int r1)
{
    float probs[GH * GW * NC];
    uint8_t has[GH * GW];
    fill_rows(r0, r1 - r0, probs, has);
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_parts_chunk_begin(pt, r0, r1, &err), TW_OK);
    assert_int_equal(tw_parts_chunk_end(pt), r1);
    assert_int_equal(tw_parts_chunk_rows(pt, r0, r1 - r0, probs, has, &err), TW_OK);
    if (tw_parts_chunk_commit(pt, &err) != TW_OK) fail_msg("commit: %s", err.msg);
    assert_int_equal(tw_parts_chunk_end(pt), -1);
}

static const char *parts_dir(const char *out)
{
    return tw_test_path(out, ".tilewise/scene");
}

static void test_resume_across_shards(void **state)
{
    (void)state;
    const char *out = tw_test_tmpdir();
    tw_parts_params p1 = params(out, 0, 2), p2 = params(out, 1, 2);
    tw_parts *pt = open_parts(&p1);
    assert_int_equal(tw_parts_rows_done(pt), 0);
    commit(pt, 0, 2);
    commit(pt, 2, 3);
    /* a chunk begun and aborted (the run was stopped) leaves nothing */
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_parts_chunk_begin(pt, 3, 4, &err), TW_OK);
    tw_parts_chunk_abort(pt);
    assert_int_equal(tw_parts_chunk_end(pt), -1);
    tw_parts_close(pt);

    /* The second shard's open sees the first shard's rows. */
    pt = open_parts(&p2);
    assert_int_equal(tw_parts_rows_done(pt), 3);
    for (int r = 0; r < GH; r++) assert_int_equal(tw_parts_row_done(pt, r), r < 3);
    /* Not all rows: assembly refuses, naming them. */
    int64_t hist[NC], nodata = 0;
    tw_error_init(&err);
    assert_int_equal(tw_parts_assemble(pt, NULL, NULL, NULL, hist, &nodata, &err), TW_ERR_INPUT);
    assert_non_null(strstr(err.msg, "scene: output rows 3..5 are not finished yet"));
    commit(pt, 3, 6);
    tw_parts_close(pt);

    /* merge: everything committed; the stem is listed; assembly counts the
     * argmax of every cell and the one nodata cell, then the parts go. */
    char(*stems)[256] = calloc(8, 256);
    assert_int_equal(tw_parts_list(out, stems, 8), 1);
    assert_string_equal(stems[0], "scene");
    free(stems);
    tw_parts_params pm = params(out, 0, 1);
    pm.merge_only = true;
    pt = open_parts(&pm);
    assert_int_equal(tw_parts_rows_done(pt), GH);
    memset(hist, 0, sizeof hist);
    tw_error_init(&err);
    if (tw_parts_assemble(pt, NULL, NULL, NULL, hist, &nodata, &err) != TW_OK)
        fail_msg("assemble: %s", err.msg);
    int64_t want[NC] = {0};
    for (int r = 0; r < GH; r++)
        for (int c = 0; c < GW; c++)
            if (!(r == 2 && c == GW - 1)) want[(r + c) % NC]++;
    for (int k = 0; k < NC; k++) assert_int_equal(hist[k], want[k]);
    assert_int_equal(nodata, 1);
    assert_int_equal(tw_parts_remove(pt, &err), TW_OK);
    tw_parts_close(pt);
    struct stat sb;
    assert_int_not_equal(stat(parts_dir(out), &sb), 0);
}

/* The one file of the parts directory whose name starts with prefix and
 * contains part (NULL: any), as a path. */
static const char *parts_file(const char *out, const char *prefix, const char *part)
{
    static char path[4096];
    DIR *d = opendir(parts_dir(out));
    assert_non_null(d);
    struct dirent *e;
    path[0] = '\0';
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && (!part || strstr(e->d_name, part)))
            snprintf(path, sizeof path, "%s/%s", parts_dir(out), e->d_name);
    closedir(d);
    assert_true(path[0] != '\0');
    return path;
}

/* The committed rows chunk [r0, r1) (whatever the exact name pattern: the
 * rows-* file whose name holds both numbers). */
static const char *chunk_file(const char *out, int r0, int r1)
{
    char both[32];
    snprintf(both, sizeof both, "%07d-%07d", r0, r1);
    return parts_file(out, "rows-", both);
}

static void test_damaged_chunks_are_redone(void **state)
{
    (void)state;
    const char *out = tw_test_tmpdir();
    tw_parts_params p = params(out, 0, 1);
    tw_parts *pt = open_parts(&p);
    commit(pt, 0, 2);
    commit(pt, 2, 4);
    commit(pt, 4, 6);
    tw_parts_close(pt);

    /* One payload byte of the middle chunk changed: its checksum fails. */
    const char *path = chunk_file(out, 2, 4);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    fputc(c ^ 0x40, f);
    assert_int_equal(fclose(f), 0);
    /* The last chunk cut short (a disk that filled up). */
    path = chunk_file(out, 4, 6);
    assert_int_equal(truncate(path, 40), 0);

    pt = open_parts(&p);
    assert_int_equal(tw_parts_rows_done(pt), 2);
    assert_true(tw_parts_row_done(pt, 1));
    assert_false(tw_parts_row_done(pt, 2));
    assert_false(tw_parts_row_done(pt, 5));
    /* Redone, they count again. */
    commit(pt, 2, 4);
    commit(pt, 4, 6);
    tw_parts_close(pt);
    pt = open_parts(&p);
    assert_int_equal(tw_parts_rows_done(pt), GH);
    tw_parts_close(pt);
}

/* A journal line without its newline was being written when the process
 * died: that chunk is not committed, even if its file is complete. */
static void test_journal_line_cut_short(void **state)
{
    (void)state;
    const char *out = tw_test_tmpdir();
    tw_parts_params p = params(out, 0, 1);
    tw_parts *pt = open_parts(&p);
    commit(pt, 0, 3);
    commit(pt, 3, 6);
    tw_parts_close(pt);
    char journal[4096];
    snprintf(journal, sizeof journal, "%s", parts_file(out, "journal.", NULL));
    struct stat sb;
    assert_int_equal(stat(journal, &sb), 0);
    assert_int_equal(truncate(journal, sb.st_size - 1), 0); /* drop the last newline */
    pt = open_parts(&p);
    assert_int_equal(tw_parts_rows_done(pt), 3);
    assert_false(tw_parts_row_done(pt, 3));
    tw_parts_close(pt);
}

/* Tile records as a tile chunk holds them: int32 row, col, float probs[NC]. */
typedef struct rec {
    int32_t row, col;
    float p[NC];
} rec;

static void add_tiles(tw_parts *pt, int row, int n, int col0)
{
    int32_t rows[8], cols[8];
    float probs[8 * NC];
    for (int i = 0; i < n; i++) {
        rows[i] = row;
        cols[i] = col0 + i;
        for (int k = 0; k < NC; k++)
            probs[i * NC + k] = (float)row + 0.125f * (float)(col0 + i + k);
    }
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_parts_chunk_tiles(pt, n, rows, cols, probs, NULL, &err), TW_OK);
}

/* The records of the committed tile chunk [r0, r1): returns their count. */
static int read_tiles(const char *out, int r0, int r1, rec *recs, int max)
{
    char both[32];
    snprintf(both, sizeof both, "%07d-%07d.bin", r0, r1);
    FILE *f = fopen(parts_file(out, "tiles-", both), "rb");
    assert_non_null(f);
    char magic[8];
    int32_t hdr[4];
    int64_t n;
    uint64_t fnv;
    assert_int_equal(fread(magic, 8, 1, f), 1);
    assert_int_equal(fread(hdr, sizeof hdr, 1, f), 1);
    assert_int_equal(fread(&n, sizeof n, 1, f), 1);
    assert_int_equal(fread(&fnv, sizeof fnv, 1, f), 1);
    assert_memory_equal(magic, "TWTILES1", 8);
    assert_true(n <= max);
    for (int64_t i = 0; i < n; i++) assert_int_equal(fread(&recs[i], sizeof(rec), 1, f), 1);
    fclose(f);
    return (int)n;
}

/* A checkpoint in the middle of row 2 of the chunk [0, 6): rows 0-1 are
 * finished (committed as the chunk [0, 2) with their tile records), row 2
 * is not: its sums and counts (k = 2 rows held) and its 3 tile records so
 * far go to the state. The next open finds the state, gives back the same
 * sums and counts bit for bit, and the records come first in the reopened
 * chunk [2, 6), before the tiles added after the resume. */
static void test_checkpoint_resume(void **state)
{
    (void)state;
    const char *out = tw_test_tmpdir();
    tw_parts_params p = params(out, 0, 1);
    p.tiles = true;
    tw_parts *pt = open_parts(&p);
    tw_parts_state none;
    assert_false(tw_parts_state_get(pt, &none));
    tw_error err;
    tw_error_init(&err);
    float probs[GH * GW * NC];
    uint8_t has[GH * GW];
    fill_rows(0, 2, probs, has);
    assert_int_equal(tw_parts_chunk_begin(pt, 0, 6, &err), TW_OK);
    tw_parts_chunk_mark(pt);
    add_tiles(pt, 0, 2, 0);
    tw_parts_chunk_mark(pt);
    add_tiles(pt, 1, 2, 0);
    assert_int_equal(tw_parts_chunk_rows(pt, 0, 2, probs, has, &err), TW_OK);
    tw_parts_chunk_mark(pt); /* tile row of row 2 begins */
    add_tiles(pt, 2, 3, 0);

    enum { K = 2 };
    float sum[K * GW * NC];
    uint32_t count[K * GW];
    for (int i = 0; i < K * GW * NC; i++) sum[i] = 1.0f / (float)(i + 3); /* not round */
    for (int i = 0; i < K * GW; i++) count[i] = (uint32_t)(i % 3);
    tw_parts_state ps = {.r0 = 2, .row_end = GH, .ty = 2, .tx = 3, .k = K};
    if (tw_parts_checkpoint(pt, &ps, sum, count, &err) != TW_OK) fail_msg("%s", err.msg);
    assert_true(tw_parts_row_done(pt, 1));
    assert_false(tw_parts_row_done(pt, 2));
    assert_int_equal(tw_parts_chunk_end(pt), 6); /* the rest reopened from row 2 */
    rec recs[16];
    assert_int_equal(read_tiles(out, 0, 2, recs, 16), 4);
    assert_int_equal(recs[3].row, 1);
    tw_parts_close(pt); /* a kill: the open chunk's temporaries are dropped */

    pt = open_parts(&p);
    assert_int_equal(tw_parts_rows_done(pt), 2);
    tw_parts_state got;
    assert_true(tw_parts_state_get(pt, &got));
    assert_int_equal(got.r0, 2);
    assert_int_equal(got.row_end, GH);
    assert_int_equal(got.ty, 2);
    assert_int_equal(got.tx, 3);
    assert_int_equal(got.k, K);
    float sum2[K * GW * NC];
    uint32_t count2[K * GW];
    memset(sum2, 0xff, sizeof sum2);
    assert_int_equal(tw_parts_chunk_begin(pt, 2, 6, &err), TW_OK);
    assert_int_equal(tw_parts_state_restore(pt, sum2, count2, &err), TW_OK);
    assert_false(tw_parts_state_get(pt, &got)); /* used up */
    assert_memory_equal(sum2, sum, sizeof sum);
    assert_memory_equal(count2, count, sizeof count);
    add_tiles(pt, 2, 2, 3); /* the rest of row 2, after the resume */
    fill_rows(2, 4, probs, has);
    assert_int_equal(tw_parts_chunk_rows(pt, 2, 4, probs, has, &err), TW_OK);
    assert_int_equal(tw_parts_chunk_commit(pt, &err), TW_OK);
    int n = read_tiles(out, 2, 6, recs, 16);
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++) {
        assert_int_equal(recs[i].row, 2);
        assert_int_equal(recs[i].col, i); /* raster order across the resume */
        assert_true(recs[i].p[1] == 2.0f + 0.125f * (float)(i + 1));
    }
    tw_parts_close(pt);

    /* row 2 is committed now: the state no longer counts */
    pt = open_parts(&p);
    assert_int_equal(tw_parts_rows_done(pt), GH);
    assert_false(tw_parts_state_get(pt, &got));
    tw_parts_close(pt);
}

/* A state whose bytes changed is ignored: its rows are redone from the last
 * committed row. */
static void test_damaged_state_is_ignored(void **state)
{
    (void)state;
    const char *out = tw_test_tmpdir();
    tw_parts_params p = params(out, 0, 1);
    tw_parts *pt = open_parts(&p);
    tw_error err;
    tw_error_init(&err);
    float sum[GW * NC] = {0.5f};
    uint32_t count[GW] = {1};
    tw_parts_state ps = {.r0 = 0, .row_end = GH, .ty = 0, .tx = 2, .k = 1};
    assert_int_equal(tw_parts_checkpoint(pt, &ps, sum, count, &err), TW_OK);
    tw_parts_close(pt);
    pt = open_parts(&p);
    tw_parts_state got;
    assert_true(tw_parts_state_get(pt, &got));
    tw_parts_close(pt);

    const char *path = parts_file(out, "state.", NULL);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 60, SEEK_SET), 0); /* in the sums */
    fputc(0x7f, f);
    fclose(f);
    pt = open_parts(&p);
    assert_false(tw_parts_state_get(pt, &got));
    tw_parts_close(pt);
}

/* Rows from 10^7 on (a 2^31-1 tall raster has 67 M rows at stride 32):
 * their chunk names have 8-digit rows, and assembly once ignored them
 * ("the committed chunks do not cover rows 9999360..."). One narrow column,
 * one class: a 10^7-row chunk of 50 MB, then one past it. */
static void test_rows_past_ten_million(void **state)
{
    (void)state;
    enum { BIG = 10000000, TAIL = 4, STEP = 1 << 16 };
    const char *out = tw_test_path(tw_test_tmpdir(), "tall");
    tw_parts_params p = params(out, 0, 1);
    p.grid_w = 1;
    p.grid_h = BIG + TAIL;
    p.n_classes = 1;
    tw_parts *pt = open_parts(&p);
    float *probs = malloc(sizeof(float) * STEP);
    uint8_t *has = malloc(STEP);
    assert_non_null(probs);
    assert_non_null(has);
    for (int i = 0; i < STEP; i++) probs[i] = 1.0f, has[i] = 1;
    tw_error err;
    tw_error_init(&err);
    const int spans[2][2] = {{0, BIG}, {BIG, BIG + TAIL}};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(tw_parts_chunk_begin(pt, spans[k][0], spans[k][1], &err), TW_OK);
        for (int r = spans[k][0]; r < spans[k][1]; r += STEP) {
            int n = spans[k][1] - r < STEP ? spans[k][1] - r : STEP;
            assert_int_equal(tw_parts_chunk_rows(pt, r, n, probs, has, &err), TW_OK);
        }
        if (tw_parts_chunk_commit(pt, &err) != TW_OK) fail_msg("commit: %s", err.msg);
    }
    free(probs);
    free(has);
    assert_int_equal(tw_parts_rows_done(pt), BIG + TAIL);
    int64_t hist[1] = {0}, nodata = 0;
    if (tw_parts_assemble(pt, NULL, NULL, NULL, hist, &nodata, &err) != TW_OK)
        fail_msg("assemble: %s", err.msg);
    assert_int_equal(hist[0], BIG + TAIL);
    assert_int_equal(nodata, 0);
    tw_parts_close(pt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_across_shards),
        cmocka_unit_test(test_damaged_chunks_are_redone),
        cmocka_unit_test(test_journal_line_cut_short),
        cmocka_unit_test(test_rows_past_ten_million),
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_damaged_state_is_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
