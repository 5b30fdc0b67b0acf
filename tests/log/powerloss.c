/* A power cut for the files of one directory tree, as an LD_PRELOAD shim (tests/log/powerloss.py).

   Under $POWERLOSS_ROOT, every change a process makes to a regular file's bytes is kept track
   of until the file is fsynced (fsync or fdatasync), in $POWERLOSS_JOURNAL, by the file's
   device and inode (so a rename keeps it):

     <dev>-<ino>.size     "<size> <generation>": the file's size at its last fsync (its
                          "durable" size), and how many fsyncs it has seen; written (whole, by
                          a rename) when the file is first changed (its size then: what was on
                          the disk before) and at each fsync
     <dev>-<ino>.<generation>.undo
                          records (offset u64, length u32, bytes) of the durable bytes a write,
                          a truncate or an O_TRUNC open was about to change since that fsync;
                          a record is written whole before the change is made (one cut short
                          by a kill is of a change never made)

     dirops               one line a change of a directory entry under the root, in the order
                          made (each line one O_APPEND write): "create\tPATH", "mkdir\tPATH",
                          "unlink\tPATH\tKEPT", "rmdir\tPATH", "rename\tOLD\tNEW\tKEPT" (KEPT:
                          a hard link in the journal to the file the change took a name from,
                          or "-"), and "dirsync\tDIR" after an fsync of a directory, "syncfs"
                          after a syncfs(2)
     keep.<pid>.<n>       those hard links: the inode of a file unlinked, or renamed over, is
                          kept (and its journal entries with it) until the cut

   A power cut is then: kill the processes (SIGKILL), and put every file back to its last fsync
   (powerloss.py's `cut`): the changes of directory entries not made durable by an fsync of
   their directory (or a syncfs) since undone, newest first (a file created is gone, one
   unlinked or renamed over is back); then every file truncated to its durable size and its
   undo records applied, newest first. Writes never fsynced are gone; a file created and never
   fsynced is empty, and gone if its directory was not fsynced either. (`cut` can also leave
   other states a power loss may: see powerloss.py.)

   A syncfs(2) makes every file of its file system durable: here, those this process has open
   (pylog's flush round syncs the segments it has open), and every change of a directory entry
   made before it.

   Covered: write, pwrite, writev, pwritev, ftruncate, truncate, open and openat with O_TRUNC
   or O_CREAT, fsync, fdatasync, syncfs, unlink, unlinkat, rename, renameat, renameat2, mkdir,
   mkdirat, rmdir (what CPython's os module and file objects call), with their 64-bit names.
   Not covered: writes through a shared writable mmap (pylog maps its files read-only), link,
   symlink, and renames of directories (pylog renames files only). */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static signed char fd_state[MAX_FDS]; /* 0: not looked at, 1: kept track of, -1: not */

#define REAL(name) static __typeof__(name) *real_##name
REAL(write);
REAL(pwrite);
REAL(pwrite64);
REAL(writev);
REAL(pwritev);
REAL(pwritev64);
REAL(ftruncate);
REAL(ftruncate64);
REAL(truncate);
REAL(truncate64);
REAL(fsync);
REAL(fdatasync);
REAL(close);
REAL(unlink);
REAL(unlinkat);
REAL(rename);
REAL(renameat);
REAL(renameat2);
REAL(syncfs);
REAL(mkdir);
REAL(mkdirat);
REAL(rmdir);
static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);

static const char *root;
static size_t root_length;
static const char *journal;

__attribute__((constructor)) static void init(void) {
#define FIND(name) real_##name = dlsym(RTLD_NEXT, #name)
    FIND(write); FIND(pwrite); FIND(pwrite64); FIND(writev); FIND(pwritev); FIND(pwritev64);
    FIND(ftruncate); FIND(ftruncate64); FIND(truncate); FIND(truncate64); FIND(fsync);
    FIND(fdatasync); FIND(close); FIND(unlink); FIND(unlinkat); FIND(rename); FIND(renameat);
    FIND(renameat2); FIND(open); FIND(open64); FIND(openat); FIND(openat64); FIND(syncfs);
    FIND(mkdir); FIND(mkdirat); FIND(rmdir);
    root = getenv("POWERLOSS_ROOT");
    journal = getenv("POWERLOSS_JOURNAL");
    if (root == NULL || journal == NULL) root = NULL;
    else root_length = strlen(root);
}

static void fail(const char *what) {
    /* The journal could not be kept: the test's assumptions no longer hold. */
    fprintf(stderr, "powerloss shim: %s: %s\n", what, strerror(errno));
    abort();
}

static int under_root(const char *path) {
    return root != NULL && strncmp(path, root, root_length) == 0 && path[root_length] == '/';
}

static int highest_fd = -1; /* the highest descriptor opened: syncfs looks at those below */

/* The absolute path of `path` as openat and the like take it (relative to `dirfd`, or to the
   working directory for AT_FDCWD), its directory resolved (realpath): 0 when it cannot be
   made (the call itself then fails, or it is not under the root). */
static int resolve(int dirfd, const char *path, char *out) {
    char joined[2 * PATH_MAX], parent[PATH_MAX];
    if (path[0] == '/') {
        if (snprintf(joined, sizeof joined, "%s", path) >= (int)sizeof joined) return 0;
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (getcwd(base, sizeof base) == NULL) return 0;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, base, sizeof base - 1);
            if (n <= 0) return 0;
            base[n] = 0;
        }
        if (snprintf(joined, sizeof joined, "%s/%s", base, path) >= (int)sizeof joined) return 0;
    }
    size_t length = strlen(joined);
    while (length > 1 && joined[length - 1] == '/') joined[--length] = 0;
    char *slash = strrchr(joined, '/');
    if (slash == NULL || slash == joined) return 0;
    *slash = 0;
    if (realpath(joined, parent) == NULL) return 0;
    return snprintf(out, PATH_MAX, "%s/%s", parent, slash + 1) < PATH_MAX;
}

/* Append a line to the journal's dirops, whole (one O_APPEND write). */
static void dirop(const char *line) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/dirops", journal);
    int fd = real_open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) fail("opening dirops");
    size_t length = strlen(line);
    if (real_write(fd, line, length) != (ssize_t)length) fail("writing dirops");
    real_close(fd);
}

/* Keep the file at `path` (about to lose that name) by a hard link in the journal; its name
   there, or "-" when there is no such file under the root. */
static void keep_inode(const char *path, char *kept) {
    static unsigned long long count;
    struct stat st;
    snprintf(kept, PATH_MAX, "-");
    if (!under_root(path) || lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) return;
    snprintf(kept, PATH_MAX, "%s/keep.%d.%llu", journal, (int)getpid(), ++count);
    if (link(path, kept) != 0) fail("keeping a file by a hard link");
}

/* Whether fd is a directory under the root, or the root; its path into `out`. */
static int directory_of(int fd, char *out) {
    char link[64];
    struct stat st;
    if (root == NULL || fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_MAX - 1);
    if (n <= 0) return 0;
    out[n] = 0;
    return under_root(out) || strcmp(out, root) == 0;
}

/* Whether fd is a regular file under the root (cached until it is closed). */
static int tracked(int fd) {
    if (root == NULL || fd < 0 || fd >= MAX_FDS) return 0;
    if (fd_state[fd] == 0) {
        char link[64], path[PATH_MAX];
        struct stat st;
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        int yes = 0;
        if (n > 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
            path[n] = 0;
            yes = under_root(path);
        }
        fd_state[fd] = yes ? 1 : -1;
    }
    return fd_state[fd] == 1;
}

static void entry_path(char *out, size_t size, dev_t dev, ino_t ino, const char *suffix) {
    snprintf(out, size, "%s/%llu-%llu.%s", journal, (unsigned long long)dev,
             (unsigned long long)ino, suffix);
}

static void undo_path(char *out, size_t size, dev_t dev, ino_t ino, long long generation) {
    snprintf(out, size, "%s/%llu-%llu.%lld.undo", journal, (unsigned long long)dev,
             (unsigned long long)ino, generation);
}

static void write_all(int fd, const void *data, size_t length) {
    const char *p = data;
    while (length > 0) {
        ssize_t n = real_write(fd, p, length);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("writing the journal");
        }
        p += n;
        length -= (size_t)n;
    }
}

/* Record the durable size of generation `generation`, whole or not at all (a rename). */
static void set_durable(dev_t dev, ino_t ino, off_t size, long long generation) {
    char path[PATH_MAX], tmp[PATH_MAX], text[64];
    entry_path(path, sizeof path, dev, ino, "size");
    entry_path(tmp, sizeof tmp, dev, ino, "size.tmp");
    int fd = real_open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) fail("opening a journal entry");
    int length = snprintf(text, sizeof text, "%lld %lld\n", (long long)size, generation);
    write_all(fd, text, (size_t)length);
    real_close(fd);
    if (real_rename(tmp, path) != 0) fail("renaming a journal entry");
}

/* The file's durable size and generation: as recorded, or on first sight its size now and a
   first generation of the clock's nanoseconds (recorded then): a new file on a reused inode
   never meets an undo log of the file before it. */
static off_t durable(int fd, struct stat *st, long long *generation) {
    char path[PATH_MAX], text[64];
    if (fstat(fd, st) != 0) fail("fstat");
    entry_path(path, sizeof path, st->st_dev, st->st_ino, "size");
    int entry = real_open(path, O_RDONLY);
    if (entry < 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        *generation = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
        set_durable(st->st_dev, st->st_ino, st->st_size, *generation);
        return st->st_size;
    }
    ssize_t n = read(entry, text, sizeof text - 1);
    real_close(entry);
    if (n <= 0) fail("reading a journal entry");
    text[n] = 0;
    long long size;
    if (sscanf(text, "%lld %lld", &size, generation) != 2) fail("parsing a journal entry");
    return (off_t)size;
}

/* Before bytes [start, end) of the file change: keep the durable ones among them. */
static void keep(int fd, off_t start, off_t end) {
    struct stat st;
    long long generation;
    off_t size = durable(fd, &st, &generation);
    if (end > size) end = size;
    if (end > st.st_size) end = st.st_size; /* bytes past the end were kept when cut */
    if (start >= end) return;
    size_t length = (size_t)(end - start);
    char *old = malloc(length);
    if (old == NULL) fail("malloc");
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd); /* fd may be open for writing only */
    int reader = real_open(link, O_RDONLY);
    if (reader < 0) fail("opening a file to read bytes about to change");
    size_t got = 0;
    while (got < length) {
        ssize_t n = pread(reader, old + got, length - got, start + (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("reading bytes about to change");
        got += (size_t)n;
    }
    real_close(reader);
    char path[PATH_MAX];
    undo_path(path, sizeof path, st.st_dev, st.st_ino, generation);
    int undo = real_open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (undo < 0) fail("opening an undo log");
    char *record = malloc(12 + length);
    if (record == NULL) fail("malloc");
    uint64_t offset = (uint64_t)start;
    uint32_t count = (uint32_t)length;
    memcpy(record, &offset, 8);
    memcpy(record + 8, &count, 4);
    memcpy(record + 12, old, length);
    write_all(undo, record, 12 + length);
    free(record);
    real_close(undo);
    free(old);
}

static off_t write_position(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0 && (flags & O_APPEND)) {
        struct stat st;
        if (fstat(fd, &st) != 0) fail("fstat");
        return st.st_size;
    }
    return lseek(fd, 0, SEEK_CUR);
}

static void before_write(int fd, off_t offset, size_t length) {
    pthread_mutex_lock(&lock);
    keep(fd, offset, offset + (off_t)length);
    pthread_mutex_unlock(&lock);
}

static void before_truncate(int fd, off_t length) {
    pthread_mutex_lock(&lock);
    keep(fd, length, (off_t)INT64_MAX);
    pthread_mutex_unlock(&lock);
}

/* After an fsync: the next generation, durable at the size now; the last one's undo log is
   then of no use (one left by a kill between the two is of an older generation: not read). */
static void synced(int fd) {
    struct stat st;
    long long generation;
    char path[PATH_MAX];
    pthread_mutex_lock(&lock);
    durable(fd, &st, &generation);
    set_durable(st.st_dev, st.st_ino, st.st_size, generation + 1);
    undo_path(path, sizeof path, st.st_dev, st.st_ino, generation);
    if (real_unlink(path) != 0 && errno != ENOENT) fail("removing an undo log");
    pthread_mutex_unlock(&lock);
}

ssize_t write(int fd, const void *buf, size_t count) {
    if (tracked(fd)) before_write(fd, write_position(fd), count);
    return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    if (tracked(fd)) before_write(fd, offset, count);
    return real_pwrite(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset) {
    if (tracked(fd)) before_write(fd, offset, count);
    return real_pwrite64(fd, buf, count, offset);
}

static size_t total(const struct iovec *iov, int iovcnt) {
    size_t sum = 0;
    for (int i = 0; i < iovcnt; i++) sum += iov[i].iov_len;
    return sum;
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    if (tracked(fd)) before_write(fd, write_position(fd), total(iov, iovcnt));
    return real_writev(fd, iov, iovcnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    if (tracked(fd)) before_write(fd, offset, total(iov, iovcnt));
    return real_pwritev(fd, iov, iovcnt, offset);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off64_t offset) {
    if (tracked(fd)) before_write(fd, offset, total(iov, iovcnt));
    return real_pwritev64(fd, iov, iovcnt, offset);
}

int ftruncate(int fd, off_t length) {
    if (tracked(fd)) before_truncate(fd, length);
    return real_ftruncate(fd, length);
}

int ftruncate64(int fd, off64_t length) {
    if (tracked(fd)) before_truncate(fd, length);
    return real_ftruncate64(fd, length);
}

static void truncate_path(const char *path, off_t length) {
    if (!under_root(path)) return;
    int fd = real_open(path, O_RDONLY);
    if (fd < 0) return; /* truncate itself then fails with the reason */
    fd_state[fd] = 0;
    if (tracked(fd)) before_truncate(fd, length);
    fd_state[fd] = 0;
    real_close(fd);
}

int truncate(const char *path, off_t length) {
    truncate_path(path, length);
    return real_truncate(path, length);
}

int truncate64(const char *path, off64_t length) {
    truncate_path(path, length);
    return real_truncate64(path, length);
}

static void directory_synced(int fd) {
    char path[PATH_MAX], line[PATH_MAX + 16];
    if (!directory_of(fd, path)) return;
    snprintf(line, sizeof line, "dirsync\t%s\n", path);
    pthread_mutex_lock(&lock);
    dirop(line);
    pthread_mutex_unlock(&lock);
}

int fsync(int fd) {
    int result = real_fsync(fd);
    if (result == 0 && tracked(fd)) synced(fd);
    else if (result == 0) directory_synced(fd);
    return result;
}

int fdatasync(int fd) {
    int result = real_fdatasync(fd);
    if (result == 0 && tracked(fd)) synced(fd);
    else if (result == 0) directory_synced(fd);
    return result;
}

int syncfs(int fd) {
    int result = real_syncfs(fd);
    struct stat fs;
    if (result != 0 || root == NULL || fstat(fd, &fs) != 0) return result;
    for (int each = 0; each <= highest_fd && each < MAX_FDS; each++) {
        struct stat st;
        if (tracked(each) && fstat(each, &st) == 0 && st.st_dev == fs.st_dev) synced(each);
    }
    pthread_mutex_lock(&lock);
    dirop("syncfs\n");
    pthread_mutex_unlock(&lock);
    return result;
}

int close(int fd) {
    if (fd >= 0 && fd < MAX_FDS) fd_state[fd] = 0;
    return real_close(fd);
}

/* An open: O_TRUNC of a file kept track of goes through before_truncate first. */
static int opened(int dirfd, const char *path, int flags, mode_t mode,
                  int (*real)(int, const char *, int, ...)) {
    int fd;
    char created[PATH_MAX];
    struct stat before;
    int creates = root != NULL && (flags & O_CREAT) && !(flags & __O_TMPFILE) &&
                  resolve(dirfd, path, created) && under_root(created) &&
                  lstat(created, &before) != 0 && errno == ENOENT;
    if (root != NULL && (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY) {
        fd = real(dirfd, path, flags & ~O_TRUNC, mode);
        if (fd >= 0) {
            fd_state[fd] = 0;
            if (tracked(fd)) {
                before_truncate(fd, 0);
                if (real_ftruncate(fd, 0) != 0) fail("O_TRUNC");
            } else if (real_ftruncate(fd, 0) != 0 && errno != EINVAL) {
                fail("O_TRUNC");
            }
        }
    } else {
        fd = real(dirfd, path, flags, mode);
    }
    if (fd >= 0 && fd < MAX_FDS) {
        fd_state[fd] = 0;
        if (fd > highest_fd) highest_fd = fd;
    }
    if (fd >= 0 && creates) {
        char line[PATH_MAX + 16];
        snprintf(line, sizeof line, "create\t%s\n", created);
        pthread_mutex_lock(&lock);
        dirop(line);
        pthread_mutex_unlock(&lock);
    }
    return fd;
}

static int at_open(int dirfd, const char *path, int flags, ...) {
    (void)dirfd;
    va_list args;
    va_start(args, flags);
    mode_t mode = va_arg(args, mode_t);
    va_end(args);
    return real_open(path, flags, mode);
}

static int at_open64(int dirfd, const char *path, int flags, ...) {
    (void)dirfd;
    va_list args;
    va_start(args, flags);
    mode_t mode = va_arg(args, mode_t);
    va_end(args);
    return real_open64(path, flags, mode);
}

static mode_t mode_of(int flags, va_list args) {
    return (flags & (O_CREAT | O_TMPFILE)) ? va_arg(args, mode_t) : 0;
}

int open(const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    return opened(AT_FDCWD, path, flags, mode, at_open);
}

int open64(const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    return opened(AT_FDCWD, path, flags, mode, at_open64);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    return opened(dirfd, path, flags, mode, real_openat);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    return opened(dirfd, path, flags, mode, real_openat64);
}

/* A change of directory entries, recorded after it is made (one that fails is not). */
static int unlinked(int dirfd, const char *path, int flags) {
    char target[PATH_MAX], kept[PATH_MAX], line[3 * PATH_MAX];
    int recorded = root != NULL && resolve(dirfd, path, target) && under_root(target);
    if (recorded && !(flags & AT_REMOVEDIR)) keep_inode(target, kept);
    int result = real_unlinkat(dirfd, path, flags);
    if (recorded && result == 0) {
        if (flags & AT_REMOVEDIR) snprintf(line, sizeof line, "rmdir\t%s\n", target);
        else snprintf(line, sizeof line, "unlink\t%s\t%s\n", target, kept);
        pthread_mutex_lock(&lock);
        dirop(line);
        pthread_mutex_unlock(&lock);
    } else if (recorded && !(flags & AT_REMOVEDIR) && strcmp(kept, "-") != 0) {
        real_unlink(kept);
    }
    return result;
}

static int renamed(int olddirfd, const char *old, int newdirfd, const char *new,
                   unsigned flags) {
    char from[PATH_MAX], to[PATH_MAX], kept[PATH_MAX], line[4 * PATH_MAX];
    int recorded = root != NULL && resolve(olddirfd, old, from) && resolve(newdirfd, new, to) &&
                   under_root(from) && under_root(to);
    if (recorded) keep_inode(to, kept);
    int result = real_renameat2(olddirfd, old, newdirfd, new, flags);
    if (recorded && result == 0) {
        snprintf(line, sizeof line, "rename\t%s\t%s\t%s\n", from, to, kept);
        pthread_mutex_lock(&lock);
        dirop(line);
        pthread_mutex_unlock(&lock);
    } else if (recorded && strcmp(kept, "-") != 0) {
        real_unlink(kept);
    }
    return result;
}

static int made_directory(int dirfd, const char *path, mode_t mode) {
    char target[PATH_MAX], line[PATH_MAX + 16];
    int recorded = root != NULL && resolve(dirfd, path, target) && under_root(target);
    int result = real_mkdirat(dirfd, path, mode);
    if (recorded && result == 0) {
        snprintf(line, sizeof line, "mkdir\t%s\n", target);
        pthread_mutex_lock(&lock);
        dirop(line);
        pthread_mutex_unlock(&lock);
    }
    return result;
}

int unlink(const char *path) { return unlinked(AT_FDCWD, path, 0); }

int unlinkat(int dirfd, const char *path, int flags) { return unlinked(dirfd, path, flags); }

int rmdir(const char *path) { return unlinked(AT_FDCWD, path, AT_REMOVEDIR); }

int rename(const char *old, const char *new) { return renamed(AT_FDCWD, old, AT_FDCWD, new, 0); }

int renameat(int olddirfd, const char *old, int newdirfd, const char *new) {
    return renamed(olddirfd, old, newdirfd, new, 0);
}

int renameat2(int olddirfd, const char *old, int newdirfd, const char *new, unsigned flags) {
    return renamed(olddirfd, old, newdirfd, new, flags);
}

int mkdir(const char *path, mode_t mode) { return made_directory(AT_FDCWD, path, mode); }

int mkdirat(int dirfd, const char *path, mode_t mode) {
    return made_directory(dirfd, path, mode);
}
