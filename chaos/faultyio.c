/*
 * faultyio.c - disk errors and clock jumps on demand, for the chaos harness.
 *
 * Loaded into a process with LD_PRELOAD, this library sits in front of the
 * C library's file I/O calls. While the control file names a fault, calls
 * that touch files under one directory fail the way a dying or full disk
 * makes them fail (EIO, ENOSPC) without doing anything; every other call,
 * and every call while no fault is named, goes straight to the C library.
 * It also sits in front of the wall-clock calls, so that the control file
 * can step the process's system clock forward or backward (see "clock=").
 * No root, no FUSE, no device mapper: only the environment of the process.
 *
 * Environment (both needed, or the library only passes calls through, the
 * clock calls included):
 *   KRAFTLOG_FAULTYIO_DIR      absolute directory; files at or under it are
 *                              affected ("/a/b" covers "/a/b/x", not "/a/bc");
 *                              it need not exist (for clock jumps alone, any
 *                              absolute path will do)
 *   KRAFTLOG_FAULTYIO_CONTROL  path of the control file
 *
 * The control file holds whitespace-separated tokens; unknown ones are
 * ignored, and an empty or missing file means no faults:
 *   write   write-family calls and ftruncate/truncate fail with EIO
 *   enospc  write-family calls and growing ftruncate/truncate fail with ENOSPC
 *           (with "write" too, ENOSPC wins for writes and shrinking gets EIO)
 *   read    read-family calls fail with EIO
 *   fsync   fsync, fdatasync and syncfs fail with EIO
 *   open    open, openat, creat and rename of paths under the directory
 *           fail with EIO
 *   clock=<N>  N a signed decimal integer of milliseconds ("clock=172800000",
 *           "clock=-3600000"; at most CLOCK_MAX_MS in magnitude): the wall
 *           clock reads N ms ahead of (or, negative, behind) the real one.
 *           The last well-formed clock= token wins; malformed ones are
 *           ignored; none means an offset of 0. It is process-wide: it does
 *           not depend on the directory. Shifted are clock_gettime with
 *           CLOCK_REALTIME, CLOCK_REALTIME_COARSE and CLOCK_TAI, gettimeofday
 *           and time. Every other clock id (CLOCK_MONOTONIC*, CLOCK_BOOTTIME,
 *           the CPU-time clocks...) is passed straight through for one
 *           branch. (clock_gettime64 and __clock_gettime64 exist only on
 *           32-bit glibc; x86_64 has none, so they are not interposed.)
 *
 * How a change is noticed: at most once a millisecond (CLOCK_MONOTONIC), an
 * I/O call or a read of a shifted clock stats the control file, and reads it
 * again when its inode, size or mtime changed. File timestamps come from a
 * coarse clock (a few ms per tick), so a file rewritten twice within one
 * tick, with the same size and a recycled inode, would look unchanged: the
 * file is therefore also read again on every check while its mtime is less
 * than RECENT_NS old. These checks read the clocks through the real
 * clock_gettime (dlsym RTLD_NEXT), never through the wrapper: no recursion,
 * and the mtime's age is measured against the real wall clock, whatever the
 * offset.
 *
 * Power loss: with KRAFTLOG_FAULTYIO_SYNCS set to a file's path (on its own;
 * it needs neither variable above), every successful fsync and fdatasync of
 * a regular file appends "S <dev> <ino> <size>" to that file (its size
 * before the call: what was written before the sync began is on disk after
 * it), and every successful ftruncate or truncate appends "T <dev> <ino>
 * <length>". A syncfs through an fd under a directory D (kraftlog's group
 * flush, through the lock file of a log dir) first appends "P <token> <dev>
 * <ino> <size>" for every regular file under D, then "C <token>" once the
 * call succeeded: those files are durable at those sizes only if the "C"
 * line is there (a kill during the call leaves the "P" lines alone; the
 * token, "<pid>.<n>", is unique across incarnations appending to one
 * journal). ``chaos.faultyio.lose_unsynced`` reads them after the process
 * is killed to cut each file back to what a power loss could leave (see
 * there). Each line goes in one write to a file opened with O_APPEND, so
 * lines of racing threads never interleave.
 *
 * Which fds are under the directory: a per-fd cache (fds below FD_CACHE_SIZE)
 * of unknown / inside / outside. Every fd number that open*, creat, close,
 * close_range, dup* or fcntl(F_DUPFD*) hands out or frees goes back to
 * unknown, and an unknown fd is looked up with readlink("/proc/self/fd/N")
 * the first time a fault could apply to it. Entries are single bytes written
 * with atomic stores, so racing threads can at worst both do the readlink.
 * An fd cached as inside is looked up again before a fault is applied to it,
 * so an fd number reused behind our back (a close inside the C library, such
 * as fclose's) can never get a fault it does not deserve.
 *
 * Costs: with the environment unset, one predictable branch per call. With
 * it set but no fault named, a vDSO clock read per call and a stat per
 * millisecond. clock_gettime on a clock that is never shifted costs one
 * branch more than the C library's, set or not, offset or not; a shifted
 * clock costs an extra CLOCK_MONOTONIC read for the check. Fd and path
 * lookups happen only while a fault that could apply to the call is named.
 * Nothing here allocates (all buffers are on the stack; glibc's realpath
 * may allocate for very long paths, only for "open"), and the control file
 * is read with the real functions, so there is no recursion.
 *
 * Not covered: I/O through mmap'ed memory, and calls made from inside the C
 * library itself (fopen/fread/fwrite/fclose, opendir/readdir), which do not
 * go through these symbols; sendfile, splice, copy_file_range, fallocate and
 * unlink are not interposed either. Likewise for the clock: clocks read
 * inside the C library (timespec_get, ftime, syslog's timestamps), straight
 * from the vDSO or by syscall (Go's runtime, statically linked programs)
 * keep the real time; file timestamps set by the kernel are real; and
 * absolute CLOCK_REALTIME deadlines given to the kernel (clock_nanosleep
 * with TIMER_ABSTIME, pthread_cond_timedwait, sem_timedwait, timerfd) are
 * taken as real times, so a deadline computed from a shifted clock is off by
 * the offset (CPython 3.11 waits on CLOCK_MONOTONIC and is not affected).
 */

#define _GNU_SOURCE
#undef _FORTIFY_SOURCE /* its inline wrappers would clash with our definitions */

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)  /* <linux/close_range.h>, on older headers */
#endif

#define FD_CACHE_SIZE 65536
#define CHECK_INTERVAL_NS 1000000LL  /* stat the control file at most once per ms */
#define RECENT_NS 50000000LL         /* re-read while its mtime is younger than 50 ms */
#define CONTROL_MAX 4096             /* bytes of the control file that are looked at */
#define CLOCK_MAX_MS 1000000000000000LL  /* largest clock= offset taken, ~31,700 years */

/* Fault bits, as named in the control file. */
enum {
    F_WRITE = 1 << 0,
    F_READ = 1 << 1,
    F_FSYNC = 1 << 2,
    F_ENOSPC = 1 << 3,
    F_OPEN = 1 << 4,
};

/* What a wrapped call does, to pick the fault (if any) that applies to it. */
enum call_kind { K_WRITE, K_READ, K_SYNC };

enum { FD_UNKNOWN = 0, FD_INSIDE = 1, FD_OUTSIDE = 2 };

/* ---- the real functions ------------------------------------------------ */

/*
 * One pointer per interposed symbol, found with dlsym(RTLD_NEXT) the first
 * time it is needed (or by the constructor, so that a child forked from a
 * threaded process never has to call dlsym). A symbol the C library does not
 * have (an old glibc) makes its wrapper fail with ENOSYS.
 */
#define REAL(ret, name, params)                                            \
    typedef ret (*name##_fn) params;                                       \
    static name##_fn real_##name##_ptr;                                    \
    static name##_fn real_##name(void)                                     \
    {                                                                      \
        name##_fn f = __atomic_load_n(&real_##name##_ptr, __ATOMIC_ACQUIRE); \
        if (!f) {                                                          \
            *(void **)&f = dlsym(RTLD_NEXT, #name);                        \
            __atomic_store_n(&real_##name##_ptr, f, __ATOMIC_RELEASE);     \
        }                                                                  \
        return f;                                                          \
    }

REAL(int, open, (const char *, int, ...))
REAL(int, open64, (const char *, int, ...))
REAL(int, openat, (int, const char *, int, ...))
REAL(int, openat64, (int, const char *, int, ...))
REAL(int, creat, (const char *, mode_t))
REAL(int, creat64, (const char *, mode_t))
REAL(int, close, (int))
REAL(int, close_range, (unsigned int, unsigned int, int))
REAL(int, dup, (int))
REAL(int, dup2, (int, int))
REAL(int, dup3, (int, int, int))
REAL(int, fcntl, (int, int, ...))
REAL(int, fcntl64, (int, int, ...))
REAL(ssize_t, read, (int, void *, size_t))
REAL(ssize_t, pread, (int, void *, size_t, off_t))
REAL(ssize_t, pread64, (int, void *, size_t, off64_t))
REAL(ssize_t, readv, (int, const struct iovec *, int))
REAL(ssize_t, preadv, (int, const struct iovec *, int, off_t))
REAL(ssize_t, preadv64, (int, const struct iovec *, int, off64_t))
REAL(ssize_t, preadv2, (int, const struct iovec *, int, off_t, int))
REAL(ssize_t, preadv64v2, (int, const struct iovec *, int, off64_t, int))
REAL(ssize_t, write, (int, const void *, size_t))
REAL(ssize_t, pwrite, (int, const void *, size_t, off_t))
REAL(ssize_t, pwrite64, (int, const void *, size_t, off64_t))
REAL(ssize_t, writev, (int, const struct iovec *, int))
REAL(ssize_t, pwritev, (int, const struct iovec *, int, off_t))
REAL(ssize_t, pwritev64, (int, const struct iovec *, int, off64_t))
REAL(ssize_t, pwritev2, (int, const struct iovec *, int, off_t, int))
REAL(ssize_t, pwritev64v2, (int, const struct iovec *, int, off64_t, int))
REAL(int, fsync, (int))
REAL(int, fdatasync, (int))
REAL(int, syncfs, (int))
REAL(int, ftruncate, (int, off_t))
REAL(int, ftruncate64, (int, off64_t))
REAL(int, truncate, (const char *, off_t))
REAL(int, truncate64, (const char *, off64_t))
REAL(int, rename, (const char *, const char *))
REAL(int, renameat, (int, const char *, int, const char *))
REAL(int, renameat2, (int, const char *, int, const char *, unsigned int))
REAL(int, gettimeofday, (struct timeval *, void *))
REAL(time_t, time, (time_t *))

/*
 * clock_gettime is called far more often than the rest (CLOCK_MONOTONIC, by
 * every timeout and timer), so its pointer starts out at a stub that looks
 * the real function up, instead of being tested for NULL on every call.
 */
typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
static int resolve_clock_gettime(clockid_t clock, struct timespec *ts);
static clock_gettime_fn real_clock_gettime_ptr = resolve_clock_gettime;

static clock_gettime_fn lookup_clock_gettime(void)
{
    clock_gettime_fn f;
    *(void **)&f = dlsym(RTLD_NEXT, "clock_gettime");
    if (f)
        __atomic_store_n(&real_clock_gettime_ptr, f, __ATOMIC_RELEASE);
    return f;
}

static int resolve_clock_gettime(clockid_t clock, struct timespec *ts)
{
    clock_gettime_fn f = lookup_clock_gettime();
    if (!f) {
        errno = ENOSYS;
        return -1;
    }
    return f(clock, ts);
}

/* The C library's clock_gettime: what the library itself must always use. */
static inline int real_clock_gettime(clockid_t clock, struct timespec *ts)
{
    return __atomic_load_n(&real_clock_gettime_ptr, __ATOMIC_ACQUIRE)(clock, ts);
}

static void resolve_all(void)
{
    real_open(); real_open64(); real_openat(); real_openat64(); real_creat(); real_creat64();
    real_close(); real_close_range(); real_dup(); real_dup2(); real_dup3();
    real_fcntl(); real_fcntl64();
    real_read(); real_pread(); real_pread64(); real_readv();
    real_preadv(); real_preadv64(); real_preadv2(); real_preadv64v2();
    real_write(); real_pwrite(); real_pwrite64(); real_writev();
    real_pwritev(); real_pwritev64(); real_pwritev2(); real_pwritev64v2();
    real_fsync(); real_fdatasync(); real_ftruncate(); real_ftruncate64();
    real_truncate(); real_truncate64(); real_rename(); real_renameat(); real_renameat2();
    real_gettimeofday(); real_time(); lookup_clock_gettime();
}

/* Calls a real function, or fails with ENOSYS when the C library lacks it. */
#define CALL_REAL(name, args) \
    (real_##name() ? real_##name() args : (errno = ENOSYS, -1))

/* ---- configuration ----------------------------------------------------- */

static int g_state;                    /* 0: not set up, 1: being set up, 2: ready */
static int g_enabled;                  /* both variables set and usable */
static char g_dir[PATH_MAX];           /* the directory, without a trailing '/' */
static size_t g_dirlen;
static char g_control[PATH_MAX];

static int g_syncs_fd = -1;            /* KRAFTLOG_FAULTYIO_SYNCS, open for appending */

static int g_faults;                   /* F_* bits now in force */
static long long g_clock_ms;           /* wall-clock offset now in force, in ms */
static long long g_next_check_ns;      /* CLOCK_MONOTONIC time of the next stat */
static int g_checking;                 /* try-lock: one thread refreshes at a time */

/* Identity of the control file as last read; guarded by g_checking. */
static struct {
    int valid;
    dev_t dev;
    ino_t ino;
    off_t size;
    long long mtime_ns;
} g_seen;

static unsigned char g_fdstate[FD_CACHE_SIZE];

/* Hides what the compiler knows about a pointer: the C library declares
 * path arguments nonnull, and the checks for NULL below must not be
 * optimised away (a NULL path gets EFAULT from the kernel, not a crash). */
static const char *opaque(const char *p)
{
    __asm__("" : "+r"(p));
    return p;
}

/* Collapses "//", "/./" and "/x/../" in an absolute path, in place. */
static void normalize(char *path)
{
    char *out = path;
    const char *in = path;
    while (*in) {
        while (*in == '/')
            in++;
        if (!*in)
            break;
        const char *seg = in;
        size_t n = 0;
        while (seg[n] && seg[n] != '/')
            n++;
        in += n;
        if (n == 1 && seg[0] == '.')
            continue;
        if (n == 2 && seg[0] == '.' && seg[1] == '.') {
            while (out > path && *--out != '/')
                ;
            continue;
        }
        /* Never writes ahead of `in`: each segment read took at least one
         * '/' plus its n bytes, and n + 1 bytes are written for it. */
        *out++ = '/';
        memmove(out, seg, n);
        out += n;
    }
    if (out == path)
        *out++ = '/';
    *out = '\0';
}

/* The sync journal, appended to: on a high fd (a program closing the fds it
 * did not open leaves it be). A last line a killed process left unfinished
 * is ended with "!", which makes it unreadable, so it is ignored rather
 * than taken for a smaller size or glued to the next line. */
static void open_journal(const char *path)
{
    int fd = real_open()(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (real_fcntl()) {
        int high = real_fcntl()(fd, F_DUPFD_CLOEXEC, 1000);
        if (high >= 0) {
            if (real_close())
                real_close()(fd);
            fd = high;
        }
    }
    struct stat st;
    char last = '\n';
    if (fstat(fd, &st) == 0 && st.st_size > 0 && real_pread())
        (void)real_pread()(fd, &last, 1, st.st_size - 1);
    if (last != '\n' && real_write())
        (void)real_write()(fd, "!\n", 2);  /* spoils the cut line: never read */
    g_syncs_fd = fd;
}

static void setup(void)
{
    const char *dir = getenv("KRAFTLOG_FAULTYIO_DIR");
    const char *control = getenv("KRAFTLOG_FAULTYIO_CONTROL");
    const char *syncs = getenv("KRAFTLOG_FAULTYIO_SYNCS");
    resolve_all();
    if (syncs && syncs[0] && real_open())
        open_journal(syncs);
    if (!dir || !control || dir[0] != '/' || !control[0])
        return;
    if (strlen(dir) >= sizeof g_dir || strlen(control) >= sizeof g_control)
        return;
    /* The kernel reports fd paths with symlinks resolved, so compare against
     * the resolved directory; one that does not exist yet is taken as given. */
    if (!realpath(dir, g_dir))
        strcpy(g_dir, dir);
    normalize(g_dir);
    g_dirlen = strlen(g_dir);
    strcpy(g_control, control);
    g_enabled = 1;
}

/* Sets up on first use. A call made while another thread (or this one, from
 * inside setup) is setting up just passes through: returns 0 until ready. */
static int ready(void)
{
    int state = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
    if (state == 2)
        return g_enabled;
    int expected = 0;
    if (state == 0 &&
        __atomic_compare_exchange_n(&g_state, &expected, 1, 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        setup();
        __atomic_store_n(&g_state, 2, __ATOMIC_RELEASE);
        return g_enabled;
    }
    return 0;
}

/* A fork while another thread held the refresh try-lock would leave the
 * child unable to ever refresh: the child starts with it free, and re-reads. */
static void after_fork_in_child(void)
{
    g_seen.valid = 0;
    __atomic_store_n(&g_next_check_ns, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_checking, 0, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void faultyio_init(void)
{
    if (ready())
        pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* ---- the control file -------------------------------------------------- */

static long long clock_ns(clockid_t clock)
{
    struct timespec ts;
    real_clock_gettime(clock, &ts);  /* never the wrapper below */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long mtime_ns(const struct stat *st)
{
    return (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int token_bit(const char *tok, size_t n)
{
    static const struct { const char *name; int bit; } names[] = {
        {"write", F_WRITE}, {"read", F_READ}, {"fsync", F_FSYNC},
        {"enospc", F_ENOSPC}, {"open", F_OPEN},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == n && memcmp(names[i].name, tok, n) == 0)
            return names[i].bit;
    return 0;
}

/* Whether `tok` is a well-formed "clock=<signed integer>" token within
 * CLOCK_MAX_MS; if so, stores its value in *ms. */
static int parse_clock(const char *tok, size_t n, long long *ms)
{
    static const char prefix[] = "clock=";
    size_t i = sizeof prefix - 1;
    if (n <= i || memcmp(tok, prefix, i) != 0)
        return 0;
    int negative = tok[i] == '-';
    if (tok[i] == '-' || tok[i] == '+')
        i++;
    if (i == n)
        return 0;
    long long value = 0;
    for (; i < n; i++) {
        if (tok[i] < '0' || tok[i] > '9')
            return 0;
        value = value * 10 + (tok[i] - '0');
        if (value > CLOCK_MAX_MS)  /* checked each digit, so it cannot overflow */
            return 0;
    }
    *ms = negative ? -value : value;
    return 1;
}

/* The F_* bits the control file names; its clock offset goes to *clock_ms. */
static int parse_control(const char *text, size_t len, long long *clock_ms)
{
    int faults = 0;
    size_t i = 0;
    *clock_ms = 0;
    while (i < len) {
        while (i < len && is_space(text[i]))
            i++;
        size_t start = i;
        while (i < len && !is_space(text[i]))
            i++;
        if (i > start && !parse_clock(text + start, i - start, clock_ms))
            faults |= token_bit(text + start, i - start);
    }
    return faults;
}

static void forget_fd(int fd)
{
    if (fd >= 0 && fd < FD_CACHE_SIZE)
        __atomic_store_n(&g_fdstate[fd], FD_UNKNOWN, __ATOMIC_RELAXED);
}

/* Installs what a control file says (nothing, for a missing one). */
static void install(int faults, long long clock_ms)
{
    __atomic_store_n(&g_faults, faults, __ATOMIC_RELEASE);
    __atomic_store_n(&g_clock_ms, clock_ms, __ATOMIC_RELEASE);
}

/* Reads the control file (with the real functions) and installs its faults
 * and clock offset. On a failure other than "no such file", the old ones stay
 * and g_seen is left invalid, so the next check tries again. */
static void reload_control(void)
{
    g_seen.valid = 0;
    int fd = CALL_REAL(open, (g_control, O_RDONLY | O_CLOEXEC));
    if (fd < 0) {
        if (errno == ENOENT)
            install(0, 0);
        return;
    }
    struct stat st;
    char buf[CONTROL_MAX];
    size_t len = 0;
    int ok = fstat(fd, &st) == 0;
    while (ok && len < sizeof buf) {
        ssize_t n = CALL_REAL(read, (fd, buf + len, sizeof buf - len));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            ok = 0;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    CALL_REAL(close, (fd));
    forget_fd(fd);
    if (!ok)
        return;
    long long clock_ms;
    int faults = parse_control(buf, len, &clock_ms);
    install(faults, clock_ms);
    g_seen.valid = 1;
    g_seen.dev = st.st_dev;
    g_seen.ino = st.st_ino;
    g_seen.size = st.st_size;
    g_seen.mtime_ns = mtime_ns(&st);
}

/* Picks up a changed control file; cheap when called more than once per ms. */
static void refresh_control(void)
{
    long long now = clock_ns(CLOCK_MONOTONIC);
    if (now < __atomic_load_n(&g_next_check_ns, __ATOMIC_RELAXED))
        return;
    int expected = 0;
    if (!__atomic_compare_exchange_n(&g_checking, &expected, 1, 0,
                                     __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return;  /* another thread is at it; use the faults as they are */
    __atomic_store_n(&g_next_check_ns, now + CHECK_INTERVAL_NS, __ATOMIC_RELAXED);

    struct stat st;
    if (stat(g_control, &st) != 0) {
        if (errno == ENOENT) {
            g_seen.valid = 0;
            install(0, 0);
        }
    } else {
        long long age = clock_ns(CLOCK_REALTIME) - mtime_ns(&st);
        int changed = !g_seen.valid || st.st_dev != g_seen.dev || st.st_ino != g_seen.ino ||
                      st.st_size != g_seen.size || mtime_ns(&st) != g_seen.mtime_ns;
        if (changed || age < RECENT_NS)
            reload_control();
    }
    __atomic_store_n(&g_checking, 0, __ATOMIC_RELEASE);
}

/* Whether the library is on; if so, first picks up a changed control file.
 * Keeps errno. */
static int refreshed(void)
{
    if (!ready())
        return 0;
    int saved = errno;
    refresh_control();
    errno = saved;
    return 1;
}

/* The faults in force now (0 when the library is off); keeps errno. */
static int current_faults(void)
{
    return refreshed() ? __atomic_load_n(&g_faults, __ATOMIC_ACQUIRE) : 0;
}

/* The wall-clock offset in force now, in ms (0 when the library is off);
 * keeps errno. */
static long long current_clock_ms(void)
{
    return refreshed() ? __atomic_load_n(&g_clock_ms, __ATOMIC_ACQUIRE) : 0;
}

/* ---- is it under the directory? --------------------------------------- */

static int under_dir(const char *path)
{
    if (g_dirlen == 1)  /* the directory is "/" */
        return path[0] == '/';
    return strncmp(path, g_dir, g_dirlen) == 0 &&
           (path[g_dirlen] == '\0' || path[g_dirlen] == '/');
}

/* Writes the path the kernel has for `fd` into buf; returns its length or -1. */
static ssize_t fd_path(int fd, char *buf, size_t size)
{
    char link[32] = "/proc/self/fd/";
    char digits[12];
    int n = 0;
    unsigned int v = (unsigned int)fd;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    size_t at = strlen(link);
    while (n)
        link[at++] = digits[--n];
    link[at] = '\0';
    ssize_t len = readlink(link, buf, size - 1);
    if (len >= 0)
        buf[len] = '\0';
    return len;
}

/* Whether `fd` refers to something under the directory (see the top comment
 * on caching). Keeps errno. */
static int fd_inside(int fd)
{
    if (fd < 0)
        return 0;
    int state = fd < FD_CACHE_SIZE ? __atomic_load_n(&g_fdstate[fd], __ATOMIC_RELAXED)
                                   : FD_UNKNOWN;
    if (state == FD_OUTSIDE)
        return 0;
    int saved = errno;
    char path[PATH_MAX + 1];
    ssize_t len = fd_path(fd, path, sizeof path);
    errno = saved;
    if (len < 0)
        return 0;  /* not an open fd: the real call reports that */
    int inside = under_dir(path);  /* "/dir/f (deleted)" still counts as inside */
    if (fd < FD_CACHE_SIZE)
        __atomic_store_n(&g_fdstate[fd], inside ? FD_INSIDE : FD_OUTSIDE, __ATOMIC_RELAXED);
    return inside;
}

/* Whether `path` (relative to `dirfd`, as for openat) names something under
 * the directory. Symlinks are resolved as far as the path exists. */
static int path_inside(int dirfd, const char *path)
{
    path = opaque(path);
    if (!path || !path[0])
        return 0;
    int saved = errno;
    char full[2 * PATH_MAX + 2];
    char resolved[PATH_MAX];
    int inside = 0;

    if (path[0] == '/') {
        if (strlen(path) >= sizeof full)
            goto out;
        strcpy(full, path);
    } else {
        size_t base;
        if (dirfd == AT_FDCWD) {
            if (!getcwd(full, PATH_MAX))
                goto out;
        } else if (fd_path(dirfd, full, PATH_MAX) < 0) {
            goto out;
        }
        base = strlen(full);
        if (base + 1 + strlen(path) >= sizeof full)
            goto out;
        full[base] = '/';
        strcpy(full + base + 1, path);
    }
    normalize(full);

    if (realpath(full, resolved)) {
        inside = under_dir(resolved);
    } else {
        /* Not there (yet): resolve its parent and put the last name back. */
        char *slash = strrchr(full, '/');
        if (slash && slash != full) {
            *slash = '\0';
            int parent_ok = realpath(full, resolved) != NULL;
            *slash = '/';
            size_t rlen = parent_ok ? strlen(resolved) : 0;
            if (parent_ok && rlen + strlen(slash) < sizeof resolved) {
                strcpy(resolved + (rlen == 1 ? 0 : rlen), slash);
                inside = under_dir(resolved);
            } else {
                inside = under_dir(full);
            }
        } else {
            inside = under_dir(full);
        }
    }
out:
    errno = saved;
    return inside;
}

/* ---- deciding on a fault ----------------------------------------------- */

/* The errno a call of this kind on `fd` must fail with, or 0 to let it run. */
static int fd_fault(int fd, enum call_kind kind)
{
    int faults = current_faults();
    int err = 0;
    if (kind == K_WRITE && (faults & F_ENOSPC))
        err = ENOSPC;
    else if (kind == K_WRITE && (faults & F_WRITE))
        err = EIO;
    else if (kind == K_READ && (faults & F_READ))
        err = EIO;
    else if (kind == K_SYNC && (faults & F_FSYNC))
        err = EIO;
    return err && fd_inside(fd) ? err : 0;
}

/* For truncation to `length`: a full disk refuses only growth; a write fault
 * refuses any change. `size` is the current size, or -1 if unknown. */
static int truncate_errno(int faults, off64_t size, off64_t length)
{
    if ((faults & F_ENOSPC) && (size < 0 || length > size))
        return ENOSPC;
    if (faults & F_WRITE)
        return EIO;
    return 0;
}

static int ftruncate_fault(int fd, off64_t length)
{
    int faults = current_faults();
    if (!(faults & (F_WRITE | F_ENOSPC)) || !fd_inside(fd))
        return 0;
    int saved = errno;
    struct stat st;
    off64_t size = fstat(fd, &st) == 0 ? st.st_size : -1;
    errno = saved;
    return truncate_errno(faults, size, length);
}

static int truncate_fault(const char *path, off64_t length)
{
    int faults = current_faults();
    if (!(faults & (F_WRITE | F_ENOSPC)) || !path_inside(AT_FDCWD, path))
        return 0;
    int saved = errno;
    struct stat st;
    off64_t size = stat(path, &st) == 0 ? st.st_size : -1;
    errno = saved;
    return truncate_errno(faults, size, length);
}

/* EIO for opening or renaming a path under the directory, under "open". */
static int path_fault(int dirfd, const char *path)
{
    return (current_faults() & F_OPEN) && path_inside(dirfd, path) ? EIO : 0;
}

#define FAIL_IF(expr)              \
    do {                           \
        int err_ = (expr);         \
        if (err_) {                \
            errno = err_;          \
            return -1;             \
        }                          \
    } while (0)

/* ---- wrappers: opening and closing ------------------------------------- */

/* open's mode argument is only there when the flags create a file. */
#define MODE_ARG(flags, last, mode)                                      \
    do {                                                                 \
        if (((flags) & O_CREAT) || ((flags) & O_TMPFILE) == O_TMPFILE) { \
            va_list ap;                                                  \
            va_start(ap, last);                                          \
            mode = va_arg(ap, mode_t);                                   \
            va_end(ap);                                                  \
        }                                                                \
    } while (0)

int open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    MODE_ARG(flags, flags, mode);
    FAIL_IF(path_fault(AT_FDCWD, path));
    int fd = CALL_REAL(open, (path, flags, mode));
    forget_fd(fd);
    return fd;
}

int open64(const char *path, int flags, ...)
{
    mode_t mode = 0;
    MODE_ARG(flags, flags, mode);
    FAIL_IF(path_fault(AT_FDCWD, path));
    int fd = CALL_REAL(open64, (path, flags, mode));
    forget_fd(fd);
    return fd;
}

int openat(int dirfd, const char *path, int flags, ...)
{
    mode_t mode = 0;
    MODE_ARG(flags, flags, mode);
    FAIL_IF(path_fault(dirfd, path));
    int fd = CALL_REAL(openat, (dirfd, path, flags, mode));
    forget_fd(fd);
    return fd;
}

int openat64(int dirfd, const char *path, int flags, ...)
{
    mode_t mode = 0;
    MODE_ARG(flags, flags, mode);
    FAIL_IF(path_fault(dirfd, path));
    int fd = CALL_REAL(openat64, (dirfd, path, flags, mode));
    forget_fd(fd);
    return fd;
}

int creat(const char *path, mode_t mode)
{
    FAIL_IF(path_fault(AT_FDCWD, path));
    int fd = CALL_REAL(creat, (path, mode));
    forget_fd(fd);
    return fd;
}

int creat64(const char *path, mode_t mode)
{
    FAIL_IF(path_fault(AT_FDCWD, path));
    int fd = CALL_REAL(creat64, (path, mode));
    forget_fd(fd);
    return fd;
}

int close(int fd)
{
    int rc = CALL_REAL(close, (fd));
    forget_fd(fd);  /* closed even when close fails (EINTR, EIO) */
    return rc;
}

int close_range(unsigned int first, unsigned int last, int flags)
{
    int rc = CALL_REAL(close_range, (first, last, flags));
    if (rc == 0 && !(flags & CLOSE_RANGE_CLOEXEC))
        for (unsigned int fd = first; fd <= last && fd < FD_CACHE_SIZE; fd++)
            forget_fd((int)fd);
    return rc;
}

/* The dup family can put a new file behind an fd number without open. */
int dup(int oldfd)
{
    int fd = CALL_REAL(dup, (oldfd));
    forget_fd(fd);
    return fd;
}

int dup2(int oldfd, int newfd)
{
    int fd = CALL_REAL(dup2, (oldfd, newfd));
    forget_fd(fd);
    return fd;
}

int dup3(int oldfd, int newfd, int flags)
{
    int fd = CALL_REAL(dup3, (oldfd, newfd, flags));
    forget_fd(fd);
    return fd;
}

/* fcntl's third argument is an int, a pointer or absent; passing it on as a
 * pointer-sized value is what glibc itself does on x86_64. */
#define FCNTL_WRAPPER(name)                                       \
    int name(int fd, int cmd, ...)                                \
    {                                                             \
        va_list ap;                                               \
        va_start(ap, cmd);                                        \
        void *arg = va_arg(ap, void *);                           \
        va_end(ap);                                               \
        int rc = CALL_REAL(name, (fd, cmd, arg));                 \
        if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)             \
            forget_fd(rc);                                        \
        return rc;                                                \
    }

FCNTL_WRAPPER(fcntl)
FCNTL_WRAPPER(fcntl64)

/* ---- wrappers: reading, writing, syncing ------------------------------- */

/* A wrapper that fails with the fault for `kind` on `fd`, or runs the call.
 * `params` must name the descriptor `fd`. */
#define FD_WRAPPER(ret, name, kind, params, args)  \
    ret name params                                \
    {                                              \
        FAIL_IF(fd_fault(fd, kind));               \
        return CALL_REAL(name, args);              \
    }

FD_WRAPPER(ssize_t, read, K_READ, (int fd, void *buf, size_t n), (fd, buf, n))
FD_WRAPPER(ssize_t, pread, K_READ, (int fd, void *buf, size_t n, off_t off), (fd, buf, n, off))
FD_WRAPPER(ssize_t, pread64, K_READ, (int fd, void *buf, size_t n, off64_t off),
           (fd, buf, n, off))
FD_WRAPPER(ssize_t, readv, K_READ, (int fd, const struct iovec *iov, int cnt), (fd, iov, cnt))
FD_WRAPPER(ssize_t, preadv, K_READ, (int fd, const struct iovec *iov, int cnt, off_t off),
           (fd, iov, cnt, off))
FD_WRAPPER(ssize_t, preadv64, K_READ, (int fd, const struct iovec *iov, int cnt, off64_t off),
           (fd, iov, cnt, off))
FD_WRAPPER(ssize_t, preadv2, K_READ,
           (int fd, const struct iovec *iov, int cnt, off_t off, int flags),
           (fd, iov, cnt, off, flags))
FD_WRAPPER(ssize_t, preadv64v2, K_READ,
           (int fd, const struct iovec *iov, int cnt, off64_t off, int flags),
           (fd, iov, cnt, off, flags))

FD_WRAPPER(ssize_t, write, K_WRITE, (int fd, const void *buf, size_t n), (fd, buf, n))
FD_WRAPPER(ssize_t, pwrite, K_WRITE, (int fd, const void *buf, size_t n, off_t off),
           (fd, buf, n, off))
FD_WRAPPER(ssize_t, pwrite64, K_WRITE, (int fd, const void *buf, size_t n, off64_t off),
           (fd, buf, n, off))
FD_WRAPPER(ssize_t, writev, K_WRITE, (int fd, const struct iovec *iov, int cnt), (fd, iov, cnt))
FD_WRAPPER(ssize_t, pwritev, K_WRITE, (int fd, const struct iovec *iov, int cnt, off_t off),
           (fd, iov, cnt, off))
FD_WRAPPER(ssize_t, pwritev64, K_WRITE, (int fd, const struct iovec *iov, int cnt, off64_t off),
           (fd, iov, cnt, off))
FD_WRAPPER(ssize_t, pwritev2, K_WRITE,
           (int fd, const struct iovec *iov, int cnt, off_t off, int flags),
           (fd, iov, cnt, off, flags))
FD_WRAPPER(ssize_t, pwritev64v2, K_WRITE,
           (int fd, const struct iovec *iov, int cnt, off64_t off, int flags),
           (fd, iov, cnt, off, flags))

/* ---- the sync journal (power loss) ------------------------------------ */

/* Whether syncs are journalled; sets up on first use. */
static int journalling(void)
{
    ready();
    return __atomic_load_n(&g_syncs_fd, __ATOMIC_RELAXED) >= 0;
}

/* Appends "<kind> <dev> <ino> <size>" for a regular file; errno kept. */
static void journal(char kind, const struct stat *st, long long size)
{
    if (!S_ISREG(st->st_mode))
        return;
    char line[96];
    int n = snprintf(line, sizeof line, "%c %llu %llu %lld\n", kind,
                     (unsigned long long)st->st_dev, (unsigned long long)st->st_ino, size);
    if (n <= 0 || (size_t)n >= sizeof line)
        return;
    int saved = errno;
    if (real_write())
        (void)real_write()(g_syncs_fd, line, (size_t)n);
    errno = saved;
}

/* The file's identity and size before a sync, if syncs are journalled. */
static int stat_for_journal(int fd, struct stat *st)
{
    if (!journalling())
        return 0;
    int saved = errno;
    int ok = fstat(fd, st) == 0;
    errno = saved;
    return ok;
}

#define SYNC_WRAPPER(name)                                  \
    int name(int fd)                                        \
    {                                                       \
        FAIL_IF(fd_fault(fd, K_SYNC));                      \
        struct stat st;                                     \
        int known = stat_for_journal(fd, &st);              \
        int rc = CALL_REAL(name, (fd));                     \
        if (rc == 0 && known)                               \
            journal('S', &st, (long long)st.st_size);       \
        return rc;                                          \
    }

SYNC_WRAPPER(fsync)
SYNC_WRAPPER(fdatasync)

/* "P <token> <dev> <ino> <size>" for each regular file under `dir`. */
static void journal_tree(const char *token, const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            char sub[PATH_MAX + 1];
            int n = snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
            if (n > 0 && (size_t)n < sizeof sub && depth < 16)
                journal_tree(token, sub, depth + 1);
        } else if (S_ISREG(st.st_mode)) {
            char line[160];
            int n = snprintf(line, sizeof line, "P %s %llu %llu %lld\n", token,
                             (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                             (long long)st.st_size);
            if (n > 0 && (size_t)n < sizeof line && real_write())
                (void)real_write()(g_syncs_fd, line, (size_t)n);
        }
    }
    closedir(d);
}

static unsigned long g_syncfs_count;

/* syncfs: faulted as fsync; journalled as a sync of every file under the
 * directory holding `fd` (see the top comment), sizes taken before the call. */
int syncfs(int fd)
{
    FAIL_IF(fd_fault(fd, K_SYNC));
    char token[48] = "";
    if (journalling()) {
        int saved = errno;
        char path[PATH_MAX + 1];
        struct stat st;
        ssize_t len = fstat(fd, &st) == 0 ? fd_path(fd, path, sizeof path) : -1;
        if (len > 0) {
            if (!S_ISDIR(st.st_mode)) {  /* a file: its directory */
                char *slash = strrchr(path, '/');
                if (slash && slash != path)
                    *slash = '\0';
            }
            snprintf(token, sizeof token, "%ld.%lu", (long)getpid(),
                     __atomic_add_fetch(&g_syncfs_count, 1, __ATOMIC_RELAXED));
            journal_tree(token, path, 0);
        }
        errno = saved;
    }
    int rc = CALL_REAL(syncfs, (fd));
    if (rc == 0 && token[0]) {
        int saved = errno;
        char line[64];
        int n = snprintf(line, sizeof line, "C %s\n", token);
        if (n > 0 && (size_t)n < sizeof line && real_write())
            (void)real_write()(g_syncs_fd, line, (size_t)n);
        errno = saved;
    }
    return rc;
}

/* After a truncation that succeeded: journalled, by fd or by path. */
static void journal_truncation_fd(int fd, long long length)
{
    struct stat st;
    if (stat_for_journal(fd, &st))
        journal('T', &st, length);
}

static void journal_truncation_path(const char *path, long long length)
{
    if (!journalling())
        return;
    int saved = errno;
    struct stat st;
    if (stat(path, &st) == 0)
        journal('T', &st, length);
    errno = saved;
}

int ftruncate(int fd, off_t length)
{
    FAIL_IF(ftruncate_fault(fd, length));
    int rc = CALL_REAL(ftruncate, (fd, length));
    if (rc == 0)
        journal_truncation_fd(fd, (long long)length);
    return rc;
}

int ftruncate64(int fd, off64_t length)
{
    FAIL_IF(ftruncate_fault(fd, length));
    int rc = CALL_REAL(ftruncate64, (fd, length));
    if (rc == 0)
        journal_truncation_fd(fd, (long long)length);
    return rc;
}

int truncate(const char *path, off_t length)
{
    FAIL_IF(truncate_fault(path, length));
    int rc = CALL_REAL(truncate, (path, length));
    if (rc == 0)
        journal_truncation_path(path, (long long)length);
    return rc;
}

int truncate64(const char *path, off64_t length)
{
    FAIL_IF(truncate_fault(path, length));
    int rc = CALL_REAL(truncate64, (path, length));
    if (rc == 0)
        journal_truncation_path(path, (long long)length);
    return rc;
}

/* ---- wrappers: renaming ------------------------------------------------ */

int rename(const char *from, const char *to)
{
    FAIL_IF(path_fault(AT_FDCWD, from) ? EIO : path_fault(AT_FDCWD, to));
    return CALL_REAL(rename, (from, to));
}

int renameat(int fromdir, const char *from, int todir, const char *to)
{
    FAIL_IF(path_fault(fromdir, from) ? EIO : path_fault(todir, to));
    return CALL_REAL(renameat, (fromdir, from, todir, to));
}

int renameat2(int fromdir, const char *from, int todir, const char *to, unsigned int flags)
{
    FAIL_IF(path_fault(fromdir, from) ? EIO : path_fault(todir, to));
    return CALL_REAL(renameat2, (fromdir, from, todir, to, flags));
}

/* ---- wrappers: the wall clock ------------------------------------------ */

/* The clock ids that get the offset, as bits; all are below 32. */
#define SHIFTED_CLOCKS \
    ((1u << CLOCK_REALTIME) | (1u << CLOCK_REALTIME_COARSE) | (1u << CLOCK_TAI))

/* Moves a time `ms` milliseconds on (back, if negative); |ms| <= CLOCK_MAX_MS,
 * so nothing overflows. */
static void shift_timespec(struct timespec *ts, long long ms)
{
    long long sec = ms / 1000;  /* both truncated towards zero */
    long long nsec = ts->tv_nsec + (ms % 1000) * 1000000LL;
    if (nsec < 0) {
        nsec += 1000000000LL;
        sec--;
    } else if (nsec >= 1000000000LL) {
        nsec -= 1000000000LL;
        sec++;
    }
    ts->tv_sec += (time_t)sec;
    ts->tv_nsec = (long)nsec;
}

static void shift_timeval(struct timeval *tv, long long ms)
{
    long long sec = ms / 1000;
    long long usec = tv->tv_usec + (ms % 1000) * 1000LL;
    if (usec < 0) {
        usec += 1000000LL;
        sec--;
    } else if (usec >= 1000000LL) {
        usec -= 1000000LL;
        sec++;
    }
    tv->tv_sec += (time_t)sec;
    tv->tv_usec = (suseconds_t)usec;
}

/* clock_gettime for the clocks that get the offset; kept out of line, so
 * that the pass-through below needs no stack frame. */
__attribute__((noinline)) static int shifted_clock_gettime(clockid_t clock, struct timespec *ts)
{
    long long ms = current_clock_ms();  /* before reading: its check takes time */
    int rc = real_clock_gettime(clock, ts);
    if (rc == 0 && ms)
        shift_timespec(ts, ms);
    return rc;
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    /* Branch-free, so that every other clock pays one branch and a tail call:
     * a negative id (a CPU-time or fd clock) is huge as unsigned and fails
     * `id < 32`. */
    unsigned int id = (unsigned int)clock;
    if ((id < 32) & (SHIFTED_CLOCKS >> (id & 31)))
        return shifted_clock_gettime(clock, ts);
    return real_clock_gettime(clock, ts);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    long long ms = current_clock_ms();
    int rc = CALL_REAL(gettimeofday, (tv, tz));
    /* The header declares tv nonnull; the kernel accepts NULL, so must we. */
    struct timeval *out = (struct timeval *)opaque((const char *)tv);
    if (rc == 0 && ms && out)
        shift_timeval(out, ms);
    return rc;
}

time_t time(time_t *tloc)
{
    long long ms = current_clock_ms();
    if (!ms)
        return CALL_REAL(time, (tloc));
    /* time() reads the coarse clock (the kernel's last tick), so this does
     * too, to count seconds exactly as it would. */
    struct timespec ts;
    if (real_clock_gettime(CLOCK_REALTIME_COARSE, &ts) != 0)
        return (time_t)-1;
    shift_timespec(&ts, ms);
    if (tloc)
        *tloc = ts.tv_sec;
    return ts.tv_sec;
}
