/* The session supervisor's protocol: the one place its numbers and its field layout are written. supervisor.c
 * includes it; the host's side (protocol.py) reads its #define lines when it is imported, and
 * tests/backends/test_supervisor_protocol.py compiles it to check that both sides read it alike. Keep every
 * constant a `#define NAME <integer expression>` on one line: that is what protocol.py parses. Its text is part of
 * the supervisor build's cache key (supervisorbin.py).
 *
 * Host -> supervisor, one request per packet: a request_head {u32 op, u32 id}, then
 *   SPAWN:  a spawn_body {u32 flags, u32 nlimits, u32 argc, u32 envc}, nlimits x spawn_rlimit
 *           {u32 resource, u32 0, u64 cur, u64 max}, then NUL-terminated strings: cwd, with FLAG_RUN_DIR the run's
 *           directory to make first (an absolute path, its parent not a symlink), argv[argc], env[envc];
 *           SCM_RIGHTS: stdin, stdout, stderr (none with FLAG_CAPTURE).
 *   SIGNAL: a signal_body {i32 pid, i32 signal, u32 group (kill the process group pid)}.
 *   LISTEN: nothing (a TCP listener on 127.0.0.1 of the session's network namespace, any free port: one run's way
 *           to its egress proxy, which the host serves on it).
 * Supervisor -> host, packets of a message_head {u32 kind, u32 id, i32 a, i32 b}:
 *   READY (0, 0, 0), SPAWNED (id, pid, errno: 0 = exec'd; pid SPAWNED_NO_RUN_DIR: the run directory's errno),
 *   EXITED (flags, pid, wait status), SIGNALED (id, errno, 0),
 *   LISTENING (id, port, errno; SCM_RIGHTS: the listener when errno is 0),
 *   OUTPUT (id of its SPAWN, fd 1/2, 0) + 1..OUT_CHUNK bytes of that output,
 *   CLOSED (id of its SPAWN, fd 1/2, 0): that output ended after the program's exit.
 */
#ifndef EXECSPACE_SUPERVISOR_PROTOCOL_H
#define EXECSPACE_SUPERVISOR_PROTOCOL_H

#include <stdint.h>

/* requests */
#define OP_SPAWN 1
#define OP_SIGNAL 2
#define OP_LISTEN 3

/* SPAWN's flags: the program gets the terminal on its stdin as its controlling one; the supervisor makes its stdio
 * (stdin /dev/null, its output forwarded in OUTPUT messages); the supervisor makes the run's directory first */
#define FLAG_CTTY 1
#define FLAG_CAPTURE 2
#define FLAG_RUN_DIR 4

/* messages */
#define MSG_READY 1
#define MSG_SPAWNED 2
#define MSG_EXITED 3
#define MSG_SIGNALED 4
#define MSG_LISTENING 5
#define MSG_OUTPUT 6
#define MSG_CLOSED 7

/* EXITED's flags: its process group lives on (its background children); with FLAG_CAPTURE, its stdout and its
 * stderr ended with it, every OUTPUT of them sent before (the usual run: one packet says it is over) */
#define EXITED_GROUP_LEFT 1
#define EXITED_STDOUT_ENDED 2
#define EXITED_STDERR_ENDED 4

/* SPAWNED's pid when the run directory could not be made */
#define SPAWNED_NO_RUN_DIR (-1)

/* limits: the largest request the host sends (argv, environment, cwd: ARG_MAX's size), the largest packet the
 * supervisor takes (a request and room to spare), the most output in one OUTPUT message, the most rlimits of a
 * SPAWN */
#define MAX_REQUEST (2 * 1024 * 1024)
#define MAX_PACKET (MAX_REQUEST + 64 * 1024)
#define OUT_CHUNK (64 * 1024)
#define MAX_RLIMITS 16

/* field layout, native byte order, no padding */
struct request_head {
    uint32_t op;
    uint32_t id;
};

struct spawn_body {
    uint32_t flags;
    uint32_t nlimits;
    uint32_t argc;
    uint32_t envc;
};

struct spawn_rlimit {
    uint32_t resource;
    uint32_t zero;
    uint64_t cur;
    uint64_t max;
};

struct signal_body {
    int32_t pid;
    int32_t signal;
    uint32_t group;
};

struct message_head {
    uint32_t kind;
    uint32_t id;
    int32_t a;
    int32_t b;
};

#endif
