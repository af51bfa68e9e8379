/*
 * Bumblehive's AppImage runtime (type 2): the ELF at the front of the .AppImage file, with
 * the AppDir appended to it as a squashfs image. Written for this project because the
 * usual runtime and appimagetool are only published as downloads outside the package
 * registries we build from; this one is built from Debian's libsquashfuse and libfuse3.
 *
 * What it does:
 *   - finds the squashfs right after its own ELF image (end of the section header table);
 *   - mounts it read-only with FUSE (libsquashfuse's low-level operations) on a fresh
 *     directory under $TMPDIR in a child process, then execs $MOUNT/AppRun in place of
 *     itself, so the pid a launcher started is the app's own; the child unmounts and
 *     removes the directory when the app exits (it watches the app through a pidfd);
 *   - where FUSE cannot be used (no /dev/fuse, no fusermount3, a container), or with
 *     --appimage-extract-and-run / APPIMAGE_EXTRACT_AND_RUN=1, extracts to a temporary
 *     directory instead, runs AppRun from there and removes it afterwards;
 *   - --appimage-extract [PATH-PREFIX] extracts into ./squashfs-root, --appimage-offset
 *     prints the offset, --appimage-help lists these.
 * The environment the AppImage spec names is set for AppRun: APPIMAGE, APPDIR, ARGV0, OWD.
 *
 * The ELF carries the AppImage magic "AI\x02" at offset 8 (written by scripts/appimage.sh).
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <squashfuse/squashfuse.h>
#include <squashfuse/ll.h>
#include <squashfuse/traverse.h>
#include <squashfuse/util.h>

static const char *me = "appimage";

/* Size of the runtime's own ELF image = where the squashfs starts. */
static long elf_end(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    Elf64_Ehdr eh;
    ssize_t n = pread(fd, &eh, sizeof eh, 0);
    close(fd);
    if (n != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64)
        return -1;
    return (long)(eh.e_shoff + (uint64_t)eh.e_shentsize * eh.e_shnum);
}

/* Writes one regular file of the image to `dest`, with its mode. */
static int extract_file(sqfs *fs, sqfs_inode *inode, const char *dest, mode_t mode) {
    int out = open(dest, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode & 07777);
    if (out < 0) return -1;
    static char buf[1 << 16];
    uint64_t size = inode->xtra.reg.file_size, pos = 0;
    while (pos < size) {
        sqfs_off_t chunk = (sqfs_off_t)(size - pos < sizeof buf ? size - pos : sizeof buf);
        if (sqfs_read_range(fs, inode, (sqfs_off_t)pos, &chunk, buf) != SQFS_OK || chunk <= 0) {
            close(out);
            return -1;
        }
        for (sqfs_off_t done = 0; done < chunk;) {
            ssize_t w = write(out, buf + done, (size_t)(chunk - done));
            if (w < 0) { close(out); return -1; }
            done += w;
        }
        pos += (uint64_t)chunk;
    }
    return close(out);
}

/* Extracts the whole image (or the entries under `prefix`) into directory `root`. */
static int extract(const char *image, long offset, const char *root, const char *prefix) {
    sqfs fs;
    if (sqfs_open_image(&fs, image, (size_t)offset) != SQFS_OK) return -1;
    if (mkdir(root, 0755) != 0 && errno != EEXIST) { sqfs_destroy(&fs); return -1; }
    sqfs_traverse trv;
    sqfs_err err = SQFS_OK;
    int rc = 0;
    if (sqfs_traverse_open(&trv, &fs, sqfs_inode_root(&fs)) != SQFS_OK) { sqfs_destroy(&fs); return -1; }
    while (rc == 0 && sqfs_traverse_next(&trv, &err)) {
        if (trv.dir_end) continue;
        if (prefix && strncmp(trv.path, prefix, strlen(prefix)) != 0) continue;
        char dest[PATH_MAX];
        if (snprintf(dest, sizeof dest, "%s/%s", root, trv.path) >= (int)sizeof dest) { rc = -1; break; }
        sqfs_inode inode;
        if (sqfs_inode_get(&fs, &inode, trv.entry.inode) != SQFS_OK) { rc = -1; break; }
        mode_t mode = inode.base.mode;
        if (S_ISDIR(mode)) {
            if (mkdir(dest, 0755) != 0 && errno != EEXIST) rc = -1;
        } else if (S_ISREG(mode)) {
            rc = extract_file(&fs, &inode, dest, mode);
        } else if (S_ISLNK(mode)) {
            char target[PATH_MAX];
            size_t size = sizeof target;
            if (sqfs_readlink(&fs, &inode, target, &size) != SQFS_OK) { rc = -1; break; }
            unlink(dest);
            if (symlink(target, dest) != 0) rc = -1;
        }
        if (rc != 0) fprintf(stderr, "%s: cannot extract %s: %s\n", me, trv.path, strerror(errno));
    }
    if (err != SQFS_OK) rc = -1;
    sqfs_traverse_close(&trv);
    sqfs_destroy(&fs);
    return rc;
}

static void set_env(const char *self, const char *appdir, const char *argv0) {
    char cwd[PATH_MAX];
    setenv("APPIMAGE", self, 1);
    setenv("APPDIR", appdir, 1);
    setenv("ARGV0", argv0, 1);
    if (getcwd(cwd, sizeof cwd)) setenv("OWD", cwd, 1);
}

static int rm_rf(const char *dir) {
    pid_t pid = fork();
    if (pid == 0) {
        execlp("rm", "rm", "-rf", "--", dir, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    return status;
}

static int tmp_dir(char *out, size_t size, const char *what) {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    snprintf(out, size, "%s/.%s_Bumblehive.XXXXXX", tmp, what);
    return mkdtemp(out) ? 0 : -1;
}

/* Extracts to a temporary directory, runs AppRun there as a child, removes it after. */
static int extract_and_run(const char *self, long offset, char **argv) {
    char dir[PATH_MAX];
    if (tmp_dir(dir, sizeof dir, "extract") != 0 || extract(self, offset, dir, NULL) != 0) {
        fprintf(stderr, "%s: cannot extract the AppImage to a temporary directory\n", me);
        return 1;
    }
    char apprun[PATH_MAX + 16];
    snprintf(apprun, sizeof apprun, "%s/AppRun", dir);
    set_env(self, dir, argv[0]);
    pid_t pid = fork();
    if (pid == 0) {
        execv(apprun, argv);
        fprintf(stderr, "%s: cannot run %s: %s\n", me, apprun, strerror(errno));
        _exit(127);
    }
    /* The app gets the terminal's signals itself; we only wait for it to clean up. */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!getenv("APPIMAGE_KEEP_EXTRACTED")) rm_rf(dir);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* Serves requests until the app is gone (`app_fd`, a pidfd, turns readable) or this process
 * is told to stop (`sig_fd`, a signalfd for SIGTERM, SIGINT and SIGHUP, which stay blocked).
 *
 * Why not libfuse's own loop and signal handlers: a dying app with many threads sends its
 * parent-death signal once per thread it reparents us to. The first SIGTERM ended libfuse's
 * loop, which then put SIGTERM back to its default, and the next one killed this process
 * before it unmounted: the mount stayed behind (the install check saw it in CI; about 1 in
 * 5 starts of the desktop app here). A handler would also race with the blocking read of
 * the device. Blocked signals read from a descriptor, polled beside the device, have
 * neither problem: a second SIGTERM only waits, unread. */
static void serve_until_gone(struct fuse_session *se, int app_fd, int sig_fd) {
    struct fuse_buf buf;
    memset(&buf, 0, sizeof buf);
    struct pollfd fds[3] = {
        {.fd = fuse_session_fd(se), .events = POLLIN},
        {.fd = sig_fd, .events = POLLIN},
        {.fd = app_fd, .events = POLLIN},
    };
    nfds_t n = app_fd >= 0 ? 3 : 2;
    while (!fuse_session_exited(se)) {
        if (poll(fds, n, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[1].revents || (n == 3 && fds[2].revents)) break;
        /* POLLERR: unmounted from outside (fusermount3 -u), nothing left to serve. */
        if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) break;
        if (!(fds[0].revents & POLLIN)) continue;
        int res = fuse_session_receive_buf(se, &buf);
        if (res == -EINTR || res == -EAGAIN) continue;
        if (res <= 0) break;
        fuse_session_process_buf(se, &buf);
    }
    free(buf.mem);
}

/* Child: serves the image on `mnt` until the parent (the app) exits. Reports on `ready`. */
static void serve_fuse(const char *self, long offset, const char *mnt, int ready, pid_t parent) {
    /* Stop requests arrive through a signalfd (see serve_until_gone), so they are blocked
     * from here on: one that comes while mounting waits in the descriptor. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGHUP);
    sigprocmask(SIG_BLOCK, &stop, NULL);
    int sig_fd = signalfd(-1, &stop, SFD_CLOEXEC);
    /* The app is watched through a pidfd: it turns readable once the whole process is gone,
     * not when its first thread is. Without pidfds (Linux before 5.3) the parent-death
     * signal stands in, read from the signalfd like any other stop. */
    int app_fd = (int)syscall(SYS_pidfd_open, parent, 0);
    if (app_fd < 0) prctl(PR_SET_PDEATHSIG, SIGTERM);
    /* The parent may have died before either was in place; then we were reparented. */
    if (getppid() != parent || sig_fd < 0) _exit(0);
    sqfs_ll *ll = sqfs_ll_open(self, (size_t)offset);
    char ok = 0;
    if (!ll) { (void)!write(ready, &ok, 1); _exit(1); }
    struct fuse_lowlevel_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.getattr = sqfs_ll_op_getattr;
    ops.opendir = sqfs_ll_op_opendir;
    ops.releasedir = sqfs_ll_op_releasedir;
    ops.readdir = sqfs_ll_op_readdir;
    ops.lookup = sqfs_ll_op_lookup;
    ops.open = sqfs_ll_op_open;
    ops.create = sqfs_ll_op_create;
    ops.release = sqfs_ll_op_release;
    ops.read = sqfs_ll_op_read;
    ops.readlink = sqfs_ll_op_readlink;
    ops.listxattr = sqfs_ll_op_listxattr;
    ops.getxattr = sqfs_ll_op_getxattr;
    ops.forget = sqfs_ll_op_forget;
    ops.statfs = stfs_ll_op_statfs;
    char *fuse_argv[] = {(char *)me, "-o", "ro,nodev,nosuid", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
    /* Quiet: a failed mount is reported by the parent, which falls back to extracting. */
    int devnull = open("/dev/null", O_WRONLY);
    int saved_err = dup(2);
    if (devnull >= 0) dup2(devnull, 2);
    sqfs_ll_chan ch;
    sqfs_err mounted = sqfs_ll_mount(&ch, mnt, &args, &ops, sizeof ops, ll);
    if (saved_err >= 0) dup2(saved_err, 2);
    if (mounted != SQFS_OK) { (void)!write(ready, &ok, 1); _exit(1); }
    ok = 1;
    (void)!write(ready, &ok, 1);
    close(ready);
    serve_until_gone(ch.session, app_fd, sig_fd);
    sqfs_ll_unmount(&ch, mnt);
    sqfs_ll_destroy(ll);
    rmdir(mnt);
    _exit(0);
}

int main(int argc, char **argv) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) { fprintf(stderr, "%s: cannot find my own file\n", me); return 1; }
    self[n] = 0;
    long offset = elf_end(self);
    if (offset <= 0) { fprintf(stderr, "%s: %s is not an AppImage\n", me, self); return 1; }

    if (argc > 1 && strncmp(argv[1], "--appimage-", 11) == 0) {
        const char *opt = argv[1] + 11;
        if (strcmp(opt, "offset") == 0) { printf("%ld\n", offset); return 0; }
        if (strcmp(opt, "extract") == 0) {
            int rc = extract(self, offset, "squashfs-root", argc > 2 ? argv[2] : NULL);
            if (rc == 0) printf("squashfs-root\n");
            return rc == 0 ? 0 : 1;
        }
        if (strcmp(opt, "extract-and-run") == 0) {
            argv[1] = argv[0];
            return extract_and_run(self, offset, argv + 1);
        }
        if (strcmp(opt, "help") == 0) {
            printf("AppImage options:\n"
                   "  --appimage-extract [PREFIX]   extract into ./squashfs-root\n"
                   "  --appimage-extract-and-run    run without FUSE (also APPIMAGE_EXTRACT_AND_RUN=1)\n"
                   "  --appimage-offset             print where the squashfs starts\n");
            return 0;
        }
        fprintf(stderr, "%s: unknown option %s (see --appimage-help)\n", me, argv[1]);
        return 2;
    }

    const char *no_fuse = getenv("APPIMAGE_EXTRACT_AND_RUN");
    if (no_fuse && strcmp(no_fuse, "1") == 0) return extract_and_run(self, offset, argv);

    char mnt[PATH_MAX];
    int pipefd[2];
    if (tmp_dir(mnt, sizeof mnt, "mount") != 0 || pipe2(pipefd, O_CLOEXEC) != 0) {
        fprintf(stderr, "%s: cannot make a mount point: %s\n", me, strerror(errno));
        return 1;
    }
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) { fprintf(stderr, "%s: fork: %s\n", me, strerror(errno)); return 1; }
    if (child == 0) {
        close(pipefd[0]);
        serve_fuse(self, offset, mnt, pipefd[1], parent);
    }
    close(pipefd[1]);
    char ok = 0;
    ssize_t got;
    do { got = read(pipefd[0], &ok, 1); } while (got < 0 && errno == EINTR);
    close(pipefd[0]);
    if (got != 1 || !ok) {
        waitpid(child, NULL, 0);
        rmdir(mnt);
        fprintf(stderr, "%s: FUSE is not available here; extracting to a temporary directory instead\n", me);
        return extract_and_run(self, offset, argv);
    }
    char apprun[PATH_MAX + 16];
    snprintf(apprun, sizeof apprun, "%s/AppRun", mnt);
    set_env(self, mnt, argv[0]);
    execv(apprun, argv);
    fprintf(stderr, "%s: cannot run %s: %s\n", me, apprun, strerror(errno));
    kill(child, SIGTERM);
    return 127;
}
