/* execspace session supervisor: PID 1 of a sandbox session's PID namespace.
 *
 * Started by bwrap --as-pid-1 with one inherited SOCK_SEQPACKET socket (argv[1]) to the host, it forks and
 * execs programs on request, reports their exits and signals their process groups. It never sees their output:
 * the host creates each program's stdio and hands the fds over with SCM_RIGHTS. As init of its namespace it
 * ignores SIGKILL/SIGSTOP from inside it and reaps every orphan; when the host's end of the socket closes it
 * exits, and the kernel kills everything left in the namespace.
 *
 * Host -> supervisor, one request per packet: u32 op, u32 id, then
 *   op 1 SPAWN:  u32 flags, u32 nlimits, u32 argc, u32 envc, nlimits x {u32 resource, u32 0, u64 cur, u64 max},
 *                then NUL-terminated strings: cwd, argv[argc], env[envc]; SCM_RIGHTS: stdin, stdout, stderr.
 *   op 2 SIGNAL: i32 pid, i32 signal, u32 group (kill the process group pid).
 *   op 3 LISTEN: nothing (a TCP listener on 127.0.0.1 of the session's network namespace, any free port: one
 *                run's way to its egress proxy, which the host serves on it).
 * Supervisor -> host, 16-byte packets: u32 kind, u32 id, i32 a, i32 b
 *   1 READY (0, 0, 0), 2 SPAWNED (id, pid, errno: 0 = exec'd), 3 EXITED (group left: 0/1, pid, wait status),
 *   4 SIGNALED (id, errno, 0), 5 LISTENING (id, port, errno; SCM_RIGHTS: the listener when errno is 0).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PACKET (2 * 1024 * 1024 + 64 * 1024) /* the host sends at most 2 MiB */
#define MAX_TRACKED 4096
#define FLAG_CTTY 1u

enum { OP_SPAWN = 1, OP_SIGNAL = 2, OP_LISTEN = 3 };
enum { MSG_READY = 1, MSG_SPAWNED = 2, MSG_EXITED = 3, MSG_SIGNALED = 4, MSG_LISTENING = 5 };

static int chan = -1;
static pid_t tracked[MAX_TRACKED];
static size_t ntracked;
static unsigned char packet[MAX_PACKET + 1];
/* written by a vfork child (which shares our memory until it execs or exits): why its exec failed */
static volatile int32_t child_err;

/* one message, with fd (when >= 0) attached */
static void reply_fd(uint32_t kind, uint32_t id, int32_t a, int32_t b, int fd) {
    uint32_t body[4] = {kind, id, (uint32_t)a, (uint32_t)b};
    struct iovec iov = {body, sizeof body};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd >= 0) {
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    for (;;) {
        if (sendmsg(chan, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof body) return;
        if (errno != EINTR) _exit(0); /* the host is gone: so is the session */
    }
}

static void reply(uint32_t kind, uint32_t id, int32_t a, int32_t b) {
    reply_fd(kind, id, a, b, -1);
}

static int untrack(pid_t pid) {
    for (size_t i = 0; i < ntracked; i++) {
        if (tracked[i] == pid) {
            tracked[i] = tracked[--ntracked];
            return 1;
        }
    }
    return 0;
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        /* whether its process group lives on (its background children): else the host need not kill it */
        if (untrack(pid)) reply(MSG_EXITED, kill(-pid, 0) == 0, pid, status);
    }
}

static void close_fds(int *fds, int n) {
    for (int i = 0; i < n; i++) close(fds[i]);
}

struct reader {
    const unsigned char *at, *end;
};

static int read_u32(struct reader *r, uint32_t *out) {
    if (r->end - r->at < 4) return -1;
    memcpy(out, r->at, 4);
    r->at += 4;
    return 0;
}

static const char *read_str(struct reader *r) {
    const unsigned char *nul = memchr(r->at, 0, (size_t)(r->end - r->at));
    if (nul == NULL) return NULL;
    const char *s = (const char *)r->at;
    r->at = nul + 1;
    return s;
}

/* the vfork child: system calls only, then exec or _exit */
__attribute__((noreturn)) static void child(int *fds, uint32_t flags, const struct rlimit *lims, const int *res, uint32_t nlim,
                  const char *cwd, char **argv, char **envp) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int err = 0;
    if (setsid() < 0) err = errno;
    for (int i = 0; i < 3 && !err; i++) {
        if (dup2(fds[i], i) < 0) err = errno;
    }
    if (!err && (flags & FLAG_CTTY) && ioctl(0, TIOCSCTTY, 0) < 0) err = errno;
    for (uint32_t i = 0; i < nlim && !err; i++) {
        if (setrlimit(res[i], &lims[i]) < 0) err = errno;
    }
    if (!err && chdir(cwd) < 0) err = errno;
    if (!err) {
        /* nothing but its stdio reaches the program: not the channel, not another program's fds */
        syscall(SYS_close_range, 3, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */);
        execve(argv[0], argv, envp);
        err = errno;
    }
    child_err = err;
    _exit(127);
}

/* vfork: we resume once the child has exec'd (or failed to, in child_err). Its own frame: nothing of the
 * caller's lives across the vfork. */
__attribute__((noinline)) static pid_t start_child(int *fds, uint32_t flags, const struct rlimit *lims,
                                                   const int *res, uint32_t nlim, const char *cwd, char **argv,
                                                   char **envp) {
    child_err = 0;
    pid_t pid = vfork();
    if (pid == 0) child(fds, flags, lims, res, nlim, cwd, argv, envp);
    return pid;
}

static void spawn(uint32_t id, struct reader *r, int *fds, int nfds) {
    uint32_t flags = 0, nlim = 0, argc = 0, envc = 0;
    int bad = nfds != 3 || read_u32(r, &flags) || read_u32(r, &nlim) || read_u32(r, &argc) ||
              read_u32(r, &envc) || nlim > 16 || argc == 0 || argc > MAX_PACKET / 2 || envc > MAX_PACKET / 2;
    struct rlimit lims[16];
    int res[16];
    for (uint32_t i = 0; !bad && i < nlim; i++) {
        uint32_t which, pad;
        uint64_t cur, max;
        bad = read_u32(r, &which) || read_u32(r, &pad) || r->end - r->at < 16;
        if (bad) break;
        memcpy(&cur, r->at, 8);
        memcpy(&max, r->at + 8, 8);
        r->at += 16;
        res[i] = (int)which;
        lims[i].rlim_cur = cur;
        lims[i].rlim_max = max;
    }
    const char *cwd = bad ? NULL : read_str(r);
    char **argv = bad ? NULL : calloc((size_t)argc + 1, sizeof *argv);
    char **envp = bad ? NULL : calloc((size_t)envc + 1, sizeof *envp);
    bad = bad || cwd == NULL || argv == NULL || envp == NULL;
    for (uint32_t i = 0; !bad && i < argc; i++) bad = (argv[i] = (char *)read_str(r)) == NULL;
    for (uint32_t i = 0; !bad && i < envc; i++) bad = (envp[i] = (char *)read_str(r)) == NULL;
    int32_t err = 0;
    pid_t pid = 0;
    if (bad || r->at != r->end) {
        err = EINVAL;
    } else if (ntracked == MAX_TRACKED) {
        err = EAGAIN;
    } else {
        pid = start_child(fds, flags, lims, res, nlim, cwd, argv, envp);
        err = pid < 0 ? errno : child_err;
        if (err == 0) tracked[ntracked++] = pid; /* a failed child is reaped without a report */
    }
    free(argv);
    free(envp);
    close_fds(fds, nfds);
    reply(MSG_SPAWNED, id, err ? 0 : pid, err);
}

static void signal_request(uint32_t id, struct reader *r) {
    uint32_t pid, sig, group;
    if (read_u32(r, &pid) || read_u32(r, &sig) || read_u32(r, &group) || r->at != r->end) {
        reply(MSG_SIGNALED, id, EINVAL, 0);
        return;
    }
    /* never ourselves, never "every process" */
    if ((int32_t)pid <= 1) {
        reply(MSG_SIGNALED, id, EINVAL, 0);
        return;
    }
    int rc = group ? kill(-(pid_t)pid, (int)sig) : kill((pid_t)pid, (int)sig);
    reply(MSG_SIGNALED, id, rc < 0 ? errno : 0, 0);
}

static void listen_request(uint32_t id, struct reader *r) {
    if (r->at != r->end) {
        reply(MSG_LISTENING, id, 0, EINVAL);
        return;
    }
    struct sockaddr_in addr = {0};
    socklen_t len = sizeof addr;
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(s, 128) < 0 ||
        getsockname(s, (struct sockaddr *)&addr, &len) < 0) {
        int err = errno;
        if (s >= 0) close(s);
        reply(MSG_LISTENING, id, 0, err);
        return;
    }
    reply_fd(MSG_LISTENING, id, ntohs(addr.sin_port), 0, s);
    close(s); /* the host serves it; no program inherits it (close-on-exec) */
}

static void serve(void) {
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 3)];
    } control;
    struct iovec iov = {packet, sizeof packet};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    ssize_t n = recvmsg(chan, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) _exit(0); /* the host closed the channel */
    int fds[3], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (nfds < 3) fds[nfds++] = fd;
            else close(fd);
        }
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n < 8) _exit(2); /* the host broke the protocol */
    struct reader r = {packet + 8, packet + n};
    uint32_t op, id;
    memcpy(&op, packet, 4);
    memcpy(&id, packet + 4, 4);
    if (op == OP_SPAWN) {
        spawn(id, &r, fds, nfds);
        return;
    }
    close_fds(fds, nfds);
    if (op == OP_SIGNAL) signal_request(id, &r);
    else if (op == OP_LISTEN) listen_request(id, &r);
    else _exit(2);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    chan = atoi(argv[1]);
    /* nothing in the sandbox may ptrace us or read our memory, though it shares our uid */
    prctl(PR_SET_DUMPABLE, 0);
    if (chan < 3) return 2;
    /* the binary's fd we were exec'd from, anything bwrap left open */
    if (chan > 3) syscall(SYS_close_range, 3, chan - 1, 0);
    syscall(SYS_close_range, chan + 1, ~0U, 0);
    fcntl(chan, F_SETFD, FD_CLOEXEC);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) return 3;
    reply(MSG_READY, 0, 0, 0);
    struct pollfd p[2] = {{chan, POLLIN, 0}, {sfd, POLLIN, 0}};
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return 4;
        }
        if (p[1].revents) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) > 0) {
            }
            reap();
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) serve();
    }
}
