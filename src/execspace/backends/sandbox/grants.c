/* The grant helper: what starts bwrap for a root caller's sandbox with host grants, run by the host's root.
 *
 * usage: grants STAGE UID drop|keep [idmap OWNER_UID OWNER_GID FD | plain FD]... -- PROGRAM [ARGS...]
 *
 * As root each sandbox runs as its workspace's unprivileged uid UID, which can neither write a tree the user owns
 * nor pass a 0700 directory above it. For each grant, the host opened its path (FD, without following a link) and
 * names how to show it:
 *
 *   idmap OWNER_UID OWNER_GID FD   a write grant: a clone of the tree's mount, idmapped so that what OWNER_UID
 *                                   and OWNER_GID own there is UID's, and what UID makes there lands as theirs;
 *                                   every other owner stays unmapped (nobody), as outside the grant
 *   plain FD                        a read grant under a directory UID cannot pass: a clone of its mount as it is
 *
 * Each clone is made while we are still in the host's mount namespace (a clone's source must be in the caller's),
 * then attached at STAGE/<n> (n from 0, in order) in a mount namespace of our own, on a tmpfs over STAGE; every
 * clone is nosuid and nodev. bwrap binds STAGE/<n> where the grant is shown. Then we drop to UID (drop) or stay
 * root for the next helper (keep: the machine helper, which makes the sandbox's own user namespace) and exec
 * PROGRAM. Nothing we mounted is seen outside our mount namespace, which dies with the sandbox.
 *
 * The idmapping's user namespace is made by a holder process per grant and kept by the mount once attached. Every
 * failure says what failed and exits 126 (the program never ran). */
#define _GNU_SOURCE
#include <grp.h>
#include <linux/mount.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define HELPER_NAME "grants"
#define HELPER_USAGE "grants STAGE UID drop|keep [idmap OWNER_UID OWNER_GID FD | plain FD]... -- PROGRAM [ARGS...]"
#include "roothelper.h"

#define MAX_GRANTS 256

/* A user namespace in which OWNER_UID/OWNER_GID are the host's UID: its fd. A holder process makes it and
 * leaves once we hold the fd (an fd keeps a namespace alive). */
static int idmapping(long owner_uid, long owner_gid, long uid) {
    int hold;
    pid_t pid = start_holder(&hold);
    char map[64];
    snprintf(map, sizeof map, "%ld %ld 1\n", owner_uid, uid);
    put(pid, "uid_map", map);
    snprintf(map, sizeof map, "%ld %ld 1\n", owner_gid, uid);
    put(pid, "gid_map", map);
    int userns = namespace_of(pid);
    close(hold);
    waitpid(pid, NULL, 0);
    return userns;
}

/* a detached clone of the mount tree at `fd` (the grant), nosuid and nodev, idmapped into `userns` unless -1 */
static int clone_tree(int fd, int userns) {
    int tree = (int)syscall(SYS_open_tree, fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE);
    if (tree < 0) fail("cloning the mount of a grant", NULL);
    struct mount_attr attr = {0};
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if (userns >= 0) {
        attr.attr_set |= MOUNT_ATTR_IDMAP;
        attr.userns_fd = (unsigned long long)userns;
    }
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr))
        fail_fix("idmapping the mount of a write grant", NULL,
             userns >= 0 ? "its filesystem (or one mounted below it) cannot be idmapped: Linux 5.12 or later and "
                           "ext4, xfs, btrfs, tmpfs (6.3) or overlayfs; grant a directory on one, or run execspace "
                           "as the tree's owner instead of root"
                         : NULL);
    return tree;
}

int main(int argc, char **argv) {
    if (argc < 6) usage();
    const char *stage = argv[1];
    long uid = number(argv[2]);
    int drop = strcmp(argv[3], "drop") == 0;
    if (!drop && strcmp(argv[3], "keep") != 0) usage();
    int trees[MAX_GRANTS], files[MAX_GRANTS], n = 0, i = 4;
    while (i < argc && strcmp(argv[i], "--") != 0) {
        if (n == MAX_GRANTS) usage();
        int userns = -1, fd;
        if (strcmp(argv[i], "idmap") == 0 && i + 3 < argc) {
            userns = idmapping(number(argv[i + 1]), number(argv[i + 2]), uid);
            fd = (int)number(argv[i + 3]);
            i += 4;
        } else if (strcmp(argv[i], "plain") == 0 && i + 1 < argc) {
            fd = (int)number(argv[i + 1]);
            i += 2;
        } else {
            usage();
        }
        struct stat st;
        if (fstat(fd, &st)) fail("fstat", "a grant");
        files[n] = !S_ISDIR(st.st_mode);
        trees[n++] = clone_tree(fd, userns);
        close(fd);
        if (userns >= 0) close(userns); /* the mount holds the namespace now */
    }
    if (i >= argc - 1) usage();

    if (unshare(CLONE_NEWNS)) fail("unshare", "(mount namespace)");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) fail("making / private", NULL);
    if (mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0711,size=64k")) fail("mount", stage);
    for (int k = 0; k < n; k++) {
        char at[4096];
        snprintf(at, sizeof at, "%s/%d", stage, k);
        if (files[k]) {
            int made = open(at, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
            if (made < 0) fail("making the mount point", at);
            close(made);
        } else if (mkdir(at, 0700)) {
            fail("mkdir", at);
        }
        if (syscall(SYS_move_mount, trees[k], "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH)) fail("move_mount", at);
        close(trees[k]);
    }
    if (drop && (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)))
        fail("dropping to the sandbox's uid", NULL);
    execvp(argv[i + 1], argv + i + 1);
    fail("execvp", argv[i + 1]);
    return FAILED;
}
