/* parts_lock.c - the parts store's locks (parts.h): one per shard, taken
 * for the run, and the directory-wide open lock around the fingerprint
 * check; who holds one, for the messages that refuse a second run.
 *
 * Open file description locks (F_OFD_SETLK), a record lock of
 * the whole file owned by one open() of it rather than by the process.
 * Like the classic POSIX record locks they go through the same kernel lock
 * code (NFS, Lustre), conflict with the classic locks of an older tilewise,
 * and die with their process, so a killed run never leaves a stale lock.
 * Unlike them they also exclude a second open() in the same process: two
 * threads running one output through the library (tilewise_run, the Python
 * package) exclude each other as two processes do, and closing another
 * descriptor of the file (other_lock_held, a second run's attempt) does not
 * drop the holder's lock. A kernel or file system without them (EINVAL)
 * gets the classic commands: processes still exclude each other.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pipeline/store/parts_internal.h"

/* fcntl(fd, one of the lock commands, fl), OFD first (see above). */
int parts_lock_fcntl(int fd, int ofd, int classic, struct flock *fl)
{
    static _Atomic int no_ofd = 0;
    if (!atomic_load(&no_ofd)) {
        fl->l_pid = 0; /* F_OFD_* require it */
        int r = fcntl(fd, ofd, fl);
        if (r == 0 || errno != EINVAL) return r;
        atomic_store(&no_ofd, 1);
    }
    return fcntl(fd, classic, fl);
}

/* What a lock file says about its holder: "pid 1234 on host node7", from
 * the file, else from F_GETLK. */
void parts_lock_holder(int fd, char *buf, size_t size)
{
    char text[256];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    long pid = 0;
    char host[200] = "";
    if (n > 0) {
        text[n] = '\0';
        if (sscanf(text, "%ld %199s", &pid, host) < 1) pid = 0;
    }
    if (pid <= 0) {
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (parts_lock_fcntl(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK)
            pid = fl.l_pid; /* -1 for an OFD lock */
    }
    if (pid > 0 && host[0])
        snprintf(buf, size, "process %ld on host %s", pid, host);
    else if (pid > 0)
        snprintf(buf, size, "process %ld", pid);
    else
        snprintf(buf, size, "another process");
}

/* Take the lock on path: returns the open descriptor (>= 0), -1 on an
 * error (errno), -2 when another run holds it (holder says who).
 * wait: block until it is free instead. */
int parts_lock_take(const char *path, bool wait, char *holder, size_t hsize)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    while (parts_lock_fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, wait ? F_SETLKW : F_SETLK,
                            &fl) != 0) {
        if (errno == EINTR && wait) continue;
        int e = errno;
        if (e == EACCES || e == EAGAIN) {
            parts_lock_holder(fd, holder, hsize);
            close(fd);
            return -2;
        }
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Write "pid host" into a lock we hold (for the message of the next one). */
void parts_lock_sign(int fd)
{
    char host[128] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "?");
    char line[200];
    int n = snprintf(line, sizeof line, "%ld %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)n, 0) == n) (void)fsync(fd);
}

/* Is another shard's lock of this directory held (by another run)?
 * Fills who (its file and holder) when it is. */
bool parts_other_lock_held(const tw_parts *pt, const char *own, char *who, size_t size)
{
    DIR *d = opendir(pt->dir);
    if (!d) return false;
    struct dirent *e;
    bool held = false;
    char path[TW_PATH_MAX + 600];
    while (!held && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "lock.", 5) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", pt->dir, e->d_name);
        if (strcmp(path, own) == 0) continue;
        /* (Our own lock file is skipped: with the classic locks' fallback,
         * closing any descriptor of a file drops the process's locks on it.) */
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) continue;
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (parts_lock_fcntl(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) {
            char h[256];
            parts_lock_holder(fd, h, sizeof h);
            int sh = 0, cnt = 0;
            if (sscanf(e->d_name, "lock.%d-of-%d", &sh, &cnt) == 2)
                snprintf(who, size, "shard %d/%d is running (%s)", sh, cnt, h);
            else
                snprintf(who, size, "%.200s is held by %s", e->d_name, h);
            held = true;
        }
        close(fd);
    }
    closedir(d);
    return held;
}

bool tw_parts_shard_running(const tw_parts *pt, int k, int n, char *who, size_t size)
{
    char path[TW_PATH_MAX + 600];
    snprintf(path, sizeof path, "%s/lock.%04d-of-%04d", pt->dir, k + 1, n);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    bool held = parts_lock_fcntl(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
    if (held) parts_lock_holder(fd, who, size);
    close(fd);
    return held;
}
