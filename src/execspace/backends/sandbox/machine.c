/* The machine helper: what starts bwrap for a sandbox in machine mode, run by the host's root.
 *
 * usage: machine ROOT_UID USER_UID STAGE [idmap|plain SEED|- LOWER UPPER_FD WORK_FD]... -- BWRAP [ARGS...]
 *
 * It makes the sandbox's user namespace, in which uid 0 is the host's ROOT_UID and uid 1000 the host's USER_UID
 * (both unprivileged), then, in a mount namespace of its own, an overlay per LAYER at STAGE/<n> (n from 0, in
 * order): its lower is LOWER read-only (idmap: a clone of LOWER's mount idmapped into that namespace, so that the
 * files the host's root owns there are root's inside; plain: LOWER as it is, whose files keep their host owners),
 * its upper and work directories are the directories open at UPPER_FD and WORK_FD (opened by the host without
 * following a link: the workspace is the program's). A SEED (a tree of the host's root, shared by every sandbox:
 * what each would otherwise have copied into its upper layer) lies between the upper layer and LOWER, idmapped as
 * an idmap LOWER is, so that its entries are root's (and user's) inside. Then it enters the user namespace as its root and execs
 * BWRAP, which binds STAGE/<n> where the sandbox shows them. Nothing it mounted is seen outside its own mount
 * namespace, which dies with the sandbox.
 *
 * A holder process makes the user namespace (unshare) and stays in it until we have entered it: its maps are
 * written from here, by the host's root, as only a privileged writer may map two host uids. Every failure says
 * what failed and exits 126 (the program never ran). */
#define _GNU_SOURCE
#include <grp.h>
#include <linux/mount.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define HELPER_NAME "machine"
#define HELPER_USAGE "machine ROOT_UID USER_UID STAGE [idmap|plain SEED|- LOWER UPPER_FD WORK_FD]... -- BWRAP [ARGS...]"
#include "roothelper.h"

/* LOWER's mount cloned read-only, idmapped into the namespace `userns`, attached at `at` */
static void idmapped_clone(const char *lower, const char *at, int userns) {
    int tree = (int)syscall(SYS_open_tree, AT_FDCWD, lower, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0) fail("open_tree", lower);
    struct mount_attr attr = {0};
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    attr.userns_fd = (unsigned long long)userns;
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr))
        fail("idmapping a clone of the mount of", lower);
    if (syscall(SYS_move_mount, tree, "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH)) fail("move_mount", at);
    close(tree);
}

/* `fd`, a directory opened in the host's mount namespace, opened again in ours (a layer must be a mount of the
 * namespace it is mounted in): by the path it has now, and only if that is still the same directory */
static int reopen_here(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) fail("readlink", link);
    path[n] = '\0';
    int here = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (here < 0) fail("open", path);
    struct stat was, now;
    if (fstat(fd, &was) || fstat(here, &now)) fail("fstat", path);
    if (was.st_dev != now.st_dev || was.st_ino != now.st_ino) {
        errno = ESTALE;
        fail("a layer directory moved while the sandbox started:", path);
    }
    close(fd);
    return here;
}

static void overlay(const char *lower, int upper, int work, const char *at) {
    char options[4096];
    int n = snprintf(options, sizeof options,
                     "lowerdir=%s,upperdir=/proc/self/fd/%d,workdir=/proc/self/fd/%d,"
                     "index=off,metacopy=off,redirect_dir=off,xino=off",
                     lower, upper, work);
    if (n < 0 || (size_t)n >= sizeof options) {
        errno = ENAMETOOLONG;
        fail("overlay options for", lower);
    }
    if (mount("overlay", at, "overlay", MS_NOSUID | MS_NODEV, options)) fail("mounting the overlay of", lower);
}

int main(int argc, char **argv) {
    if (argc < 6) usage();
    long root = number(argv[1]), user = number(argv[2]);
    const char *stage = argv[3];
    int end = 4;
    while (end < argc && strcmp(argv[end], "--") != 0) end++;
    if (end >= argc - 1 || (end - 4) % 5 != 0) usage();

    int hold;
    pid_t holder = start_holder(&hold);
    char map[96];
    snprintf(map, sizeof map, "0 %ld 1\n1000 %ld 1\n", root, user);
    put(holder, "uid_map", map);
    put(holder, "gid_map", map);
    int userns = namespace_of(holder);

    if (unshare(CLONE_NEWNS)) fail("unshare", "(mount namespace)");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) fail("making / private", NULL);
    if (mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0711,size=64k")) fail("mount", stage);
    for (int i = 4, n = 0; i < end; i += 5, n++) {
        const char *kind = argv[i], *seed = argv[i + 1], *lower = argv[i + 2];
        int upper = (int)number(argv[i + 3]), work = (int)number(argv[i + 4]);
        char merged[4096], clone[4096], seeded[4096], lowers[8200];
        snprintf(merged, sizeof merged, "%s/%d", stage, n);
        if (mkdir(merged, 0755)) fail("mkdir", merged);
        if (strcmp(kind, "idmap") == 0) {
            snprintf(clone, sizeof clone, "%s/.lower%d", stage, n);
            if (mkdir(clone, 0700)) fail("mkdir", clone);
            idmapped_clone(lower, clone, userns);
            lower = clone;
        } else if (strcmp(kind, "plain") != 0) {
            usage();
        }
        if (strcmp(seed, "-") != 0) {
            snprintf(seeded, sizeof seeded, "%s/.seed%d", stage, n);
            if (mkdir(seeded, 0700)) fail("mkdir", seeded);
            idmapped_clone(seed, seeded, userns);
            snprintf(lowers, sizeof lowers, "%s:%s", seeded, lower);
            lower = lowers;
        }
        upper = reopen_here(upper);
        work = reopen_here(work);
        overlay(lower, upper, work, merged);
        close(upper);
        close(work);
    }

    if (setns(userns, CLONE_NEWUSER)) fail("setns", "(the sandbox's user namespace)");
    close(userns);
    close(hold); /* the holder leaves: the namespace lives on in us */
    waitpid(holder, NULL, 0);
    if (setgroups(0, NULL) || setresgid(0, 0, 0) || setresuid(0, 0, 0)) fail("becoming the namespace's root", NULL);
    execvp(argv[end + 1], argv + end + 1);
    fail("execvp", argv[end + 1]);
    return FAILED;
}
