/* fileio.c - see fileio.h */
#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/params.h"

tw_status tw_write_file_atomic(const char *path, const void *data, size_t n, tw_error *err)
{
    char tmp[TW_PATH_MAX + 600];
    if (snprintf(tmp, sizeof tmp, "%s.%d.part", path, (int)getpid()) >= (int)sizeof tmp)
        return tw_error_set(err, TW_ERR_OUTPUT, "path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", path, strerror(errno));
    bool ok = fwrite(data, 1, n, f) == n;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    int e = errno;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        unlink(tmp);
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", path, strerror(e));
    }
    return TW_OK;
}

tw_status tw_mkdir_p(const char *path, tw_error *err)
{
    char buf[TW_PATH_MAX + 400];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return tw_error_set(err, TW_ERR_OUTPUT, "path too long: %s", path);
    for (char *s = buf + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return tw_error_set(err, TW_ERR_OUTPUT, "cannot create %s: %s", buf, strerror(errno));
        *s = c;
        if (c == '\0') break;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return tw_error_set(err, TW_ERR_OUTPUT, "%s is not a directory", path);
    return TW_OK;
}

tw_status tw_fsync_path(const char *path, bool missing_ok, tw_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (missing_ok && errno == ENOENT) return TW_OK;
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot open %s to sync it: %s", path,
                            strerror(errno));
    }
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    /* Directories on some file systems refuse fsync (EINVAL): nothing to lose there. */
    if (rc != 0 && !(e == EINVAL || e == EROFS))
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot sync %s: %s", path, strerror(e));
    return TW_OK;
}

tw_status tw_fsync_dir(const char *dir, tw_error *err)
{
    return tw_fsync_path(dir, false, err);
}

tw_status tw_path_check_regular(const char *path, const char *what, bool dir_ok, tw_status st,
                                tw_error *err)
{
    struct stat sb;
    if (!path || stat(path, &sb) != 0 || S_ISREG(sb.st_mode) || (dir_ok && S_ISDIR(sb.st_mode)))
        return TW_OK;
    const char *kind = S_ISFIFO(sb.st_mode)   ? "a FIFO (named pipe)"
                       : S_ISSOCK(sb.st_mode) ? "a socket"
                       : S_ISCHR(sb.st_mode)  ? "a character device"
                       : S_ISBLK(sb.st_mode)  ? "a block device"
                       : S_ISDIR(sb.st_mode)  ? "a directory"
                                              : "not a file";
    return tw_error_set(err, st, "%s %s is %s, not a regular file", what, path, kind);
}

const char *tw_json_error_text(const char *text, char *out, size_t size)
{
    if (size == 0) return out;
    const char *near = text ? strstr(text, " near ") : NULL;
    size_t n = !text ? 0 : near ? (size_t)(near - text) : strlen(text);
    if (n >= size) n = size - 1;
    memcpy(out, text ? text : "", n);
    out[n] = '\0';
    return out;
}
