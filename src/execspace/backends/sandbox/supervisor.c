/* execspace session supervisor: PID 1 of a sandbox session's PID namespace.
 *
 * Started by bwrap --as-pid-1 with one inherited SOCK_SEQPACKET socket (argv[1]) to the host, it forks and
 * execs programs on request, reports their exits and signals their process groups. A program's stdio is either
 * the host's (made by the host, handed over with SCM_RIGHTS: output goes straight to the host, never through
 * here) or, with CAPTURE (a run without stdin or terminal, the common case), made here: stdin /dev/null, stdout
 * and stderr a socketpair each (a pipe could be reopened through /proc/<pid>/fd by the session's other
 * programs), their output forwarded to the host in OUTPUT packets. As init of its namespace it ignores
 * SIGKILL/SIGSTOP from inside it and reaps every orphan; when the host's end of the socket closes it exits, and
 * the kernel kills everything left in the namespace.
 *
 * The protocol (its messages, their fields and its limits) is supervisorprotocol.h, which the host reads too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdpass.h"
#include "supervisorprotocol.h"

#define MAX_TRACKED 4096
#define DRAIN_READS 8 /* at an exit: what its output sockets hold, not a writer that goes on */
#define HEAD_SIZE sizeof(struct message_head)

/* a program we started: until it is reaped and, with CAPTURE, until both its outputs ended */
struct prog {
    pid_t pid;   /* 0 once reaped */
    uint32_t id; /* the SPAWN request: what its OUTPUT packets are named by */
    int capture;
    int out[2]; /* our ends of its stdout and stderr (CAPTURE), -1 once ended (or without CAPTURE) */
};

static int chan = -1;
static int devnull = -1;
static struct prog progs[MAX_TRACKED];
static size_t nprogs;
static unsigned char packet[MAX_PACKET + 1];
static unsigned char outbuf[HEAD_SIZE + OUT_CHUNK];
static struct pollfd polls[2 + 2 * MAX_TRACKED];
static struct prog *polled[2 * MAX_TRACKED]; /* whose output polls[2 + i] is */
/* written by a vfork child (which shares our memory until it execs or exits): why its exec failed */
static volatile int32_t child_err;

/* blocking: a host slow to read holds back the output (the program's socket fills), never loses it */
static void send_packet(const void *data, size_t len) {
    for (;;) {
        if (send(chan, data, len, MSG_NOSIGNAL) == (ssize_t)len) return;
        if (errno != EINTR) _exit(0); /* the host is gone: so is the session */
    }
}

static void reply(uint32_t kind, uint32_t id, int32_t a, int32_t b) {
    struct message_head msg = {kind, id, a, b};
    send_packet(&msg, sizeof msg);
}

/* one message with fd attached */
static void reply_fd(uint32_t kind, uint32_t id, int32_t a, int32_t b, int fd) {
    struct message_head body = {kind, id, a, b};
    for (;;) {
        if (send_with_fd(chan, &body, sizeof body, fd) == (ssize_t)sizeof body) return;
        if (errno != EINTR) _exit(0); /* the host is gone: so is the session */
    }
}

static struct prog *find(pid_t pid) {
    for (size_t i = 0; i < nprogs; i++) {
        if (progs[i].pid == pid) return &progs[i];
    }
    return NULL;
}

/* drop the programs that are over: reaped, and their output ended */
static void compact(void) {
    size_t kept = 0;
    for (size_t i = 0; i < nprogs; i++) {
        if (progs[i].pid != 0 || progs[i].out[0] >= 0 || progs[i].out[1] >= 0) progs[kept++] = progs[i];
    }
    nprogs = kept;
}

/* forward one read of output i of p; 0 once it ended (its socket closed), or when it has nothing now */
static int forward(struct prog *p, int i) {
    ssize_t n;
    do {
        n = read(p->out[i], outbuf + HEAD_SIZE, OUT_CHUNK);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN) return 0;
    if (n > 0) {
        struct message_head head = {MSG_OUTPUT, p->id, i + 1, 0};
        memcpy(outbuf, &head, sizeof head);
        send_packet(outbuf, HEAD_SIZE + (size_t)n);
        return 1;
    }
    close(p->out[i]); /* its end (or a read error: nothing more will come) */
    p->out[i] = -1;
    if (p->pid == 0) reply(MSG_CLOSED, p->id, i + 1, 0); /* after its exit: else EXITED says it */
    return 0;
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        struct prog *p = find(pid);
        if (p == NULL) continue; /* an orphan, or a child whose exec failed */
        /* whether its process group lives on (its background children): else the host need not kill it */
        uint32_t flags = kill(-pid, 0) == 0 ? EXITED_GROUP_LEFT : 0;
        for (int i = 0; i < 2 && p->capture; i++) {
            for (int reads = 0; p->out[i] >= 0 && reads < DRAIN_READS && forward(p, i);) reads++;
            if (p->out[i] < 0) flags |= (uint32_t)EXITED_STDOUT_ENDED << i;
        }
        p->pid = 0;
        reply(MSG_EXITED, flags, pid, status);
    }
    compact();
}

static void close_fds(int *fds, int n) {
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0) close(fds[i]);
    }
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
    /* an ignored signal stays ignored across exec: a host started under nohup (SIGINT and SIGQUIT ignored) must
       not hand that on, or a program's `trap ... INT` and a kernel's interrupt never work */
    signal(SIGINT, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
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

/* mkdir path, its parent opened without following a symlink there (as the host's walk refuses one) */
static int make_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (path[0] != '/' || slash == path || slash[1] == 0 || (size_t)(slash - path) >= PATH_MAX) return EINVAL;
    char parent[PATH_MAX];
    memcpy(parent, path, (size_t)(slash - path));
    parent[slash - path] = 0;
    int dir = open(parent, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0) return errno;
    int err = mkdirat(dir, slash + 1, 0755) < 0 ? errno : 0;
    close(dir);
    return err;
}

/* stdin /dev/null, stdout and stderr a socketpair each (fds[1], fds[2] the program's ends, ours[] ours) */
static int capture_stdio(int *fds, int *ours) {
    if (devnull < 0) return ENOENT;
    fds[0] = devnull;
    for (int i = 0; i < 2; i++) {
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0) return errno; /* the caller closes */
        /* ours only reads, without blocking: the program cannot read back what it wrote */
        shutdown(pair[0], SHUT_WR);
        fcntl(pair[0], F_SETFL, O_NONBLOCK);
        ours[i] = pair[0];
        fds[i + 1] = pair[1];
    }
    return 0;
}

static void spawn(uint32_t id, struct reader *r, int *fds, int nfds) {
    uint32_t flags = 0, nlim = 0, argc = 0, envc = 0;
    int bad = read_u32(r, &flags) || read_u32(r, &nlim) || read_u32(r, &argc) || read_u32(r, &envc) ||
              nfds != ((flags & FLAG_CAPTURE) ? 0 : 3) || (flags & ~(FLAG_CTTY | FLAG_CAPTURE | FLAG_RUN_DIR)) ||
              nlim > MAX_RLIMITS || argc == 0 || argc > MAX_PACKET / 2 || envc > MAX_PACKET / 2;
    struct rlimit lims[MAX_RLIMITS];
    int res[MAX_RLIMITS];
    for (uint32_t i = 0; !bad && i < nlim; i++) {
        uint32_t which, pad;
        uint64_t cur, max;
        bad = read_u32(r, &which) || read_u32(r, &pad) || r->end - r->at < 16; /* cur and max */
        if (bad) break;
        memcpy(&cur, r->at, 8);
        memcpy(&max, r->at + 8, 8);
        r->at += 16;
        res[i] = (int)which;
        lims[i].rlim_cur = cur;
        lims[i].rlim_max = max;
    }
    const char *cwd = bad ? NULL : read_str(r);
    const char *run_dir = bad || !(flags & FLAG_RUN_DIR) ? NULL : read_str(r);
    bad = bad || ((flags & FLAG_RUN_DIR) && run_dir == NULL);
    char **argv = bad ? NULL : calloc((size_t)argc + 1, sizeof *argv);
    char **envp = bad ? NULL : calloc((size_t)envc + 1, sizeof *envp);
    bad = bad || cwd == NULL || argv == NULL || envp == NULL;
    for (uint32_t i = 0; !bad && i < argc; i++) bad = (argv[i] = (char *)read_str(r)) == NULL;
    for (uint32_t i = 0; !bad && i < envc; i++) bad = (envp[i] = (char *)read_str(r)) == NULL;
    int32_t err = 0;
    pid_t pid = 0;
    int made = 0, no_dir = 0, ours[2] = {-1, -1};
    if (bad || r->at != r->end) {
        err = EINVAL;
    } else if (nprogs == MAX_TRACKED) {
        err = EAGAIN;
    } else if (run_dir != NULL && (err = make_dir(run_dir)) != 0) {
        no_dir = 1;
    } else if (!(flags & FLAG_CAPTURE) || (made = 1, err = capture_stdio(fds, ours)) == 0) {
        pid = start_child(fds, flags, lims, res, nlim, cwd, argv, envp);
        err = pid < 0 ? errno : child_err;
    }
    if (err == 0) {
        progs[nprogs++] = (struct prog){pid, id, made, {ours[0], ours[1]}};
    } else {
        close_fds(ours, 2); /* a failed child is reaped without a report */
    }
    free(argv);
    free(envp);
    /* the program's ends: those the host sent, or those made here (not the /dev/null every CAPTURE run shares) */
    if (made) close_fds(fds + 1, 2);
    else close_fds(fds, nfds);
    reply(MSG_SPAWNED, id, err ? (no_dir ? SPAWNED_NO_RUN_DIR : 0) : pid, err);
}

/* The uid of a machine sandbox's user (backends/sandbox/machine.py). */
#define MACHINE_USER 1000

static int send_signal(pid_t pid, int sig, uint32_t group) {
    int rc = group ? kill(-pid, sig) : kill(pid, sig);
    if (rc == 0 || errno != EPERM || geteuid() != 0) return rc;
    /* a machine's supervisor is its root without CAP_KILL: it signals as the user (effective uid), its real uid
       still root's, which reaches root's processes (sudo) of the group too; then it is root again */
    if (seteuid(MACHINE_USER) != 0) {
        errno = EPERM;
        return -1;
    }
    rc = group ? kill(-pid, sig) : kill(pid, sig);
    int saved = errno;
    if (seteuid(0) != 0) _exit(70); /* a supervisor that cannot be root again ends the session, never runs on */
    errno = saved;
    return rc;
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
    int rc = send_signal((pid_t)pid, (int)sig, group);
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
    int fds[3] = {-1, -1, -1}, nfds = 0;
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
    struct request_head head;
    /* the host broke the protocol */
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n < (ssize_t)sizeof head) _exit(2);
    struct reader r = {packet + sizeof head, packet + n};
    memcpy(&head, packet, sizeof head);
    if (head.op == OP_SPAWN) {
        spawn(head.id, &r, fds, nfds);
        return;
    }
    close_fds(fds, nfds);
    if (head.op == OP_SIGNAL) signal_request(head.id, &r);
    else if (head.op == OP_LISTEN) listen_request(head.id, &r);
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
    /* every CAPTURE program's stdin; without one (no /dev/null), CAPTURE spawns fail with ENOENT */
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    reply(MSG_READY, 0, 0, 0);
    polls[0] = (struct pollfd){chan, POLLIN, 0};
    polls[1] = (struct pollfd){sfd, POLLIN, 0};
    for (;;) {
        nfds_t n = 2;
        for (size_t i = 0; i < nprogs; i++) {
            for (int j = 0; j < 2; j++) {
                if (progs[i].out[j] < 0) continue;
                polled[n - 2] = &progs[i];
                polls[n++] = (struct pollfd){progs[i].out[j], POLLIN, 0};
            }
        }
        if (poll(polls, n, -1) < 0) {
            if (errno == EINTR) continue;
            return 4;
        }
        /* output first: it comes before the exit that a signal below may report */
        for (nfds_t i = 2; i < n; i++) {
            if (!polls[i].revents) continue;
            struct prog *p = polled[i - 2];
            int j = p->out[0] == polls[i].fd ? 0 : 1;
            forward(p, j);
        }
        compact();
        if (polls[1].revents) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) > 0) {
            }
            reap();
        }
        if (polls[0].revents & (POLLIN | POLLHUP | POLLERR)) serve();
    }
}
