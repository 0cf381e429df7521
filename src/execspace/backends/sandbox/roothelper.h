/* What the helpers the host's root runs before bwrap (machine.c, grants.c) share: their failure and usage
 * messages, argument numbers, writing a process's /proc files, and the holder of a new user namespace. Each
 * defines HELPER_NAME and HELPER_USAGE before including it; its text is part of their build's cache key
 * (supervisorbin.py). */
#ifndef EXECSPACE_ROOTHELPER_H
#define EXECSPACE_ROOTHELPER_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

/* the program never ran */
#define FAILED 126

/* says what failed (and, given FIX, what to do) and exits FAILED */
static void fail_fix(const char *what, const char *detail, const char *fix) {
    fprintf(stderr, "execspace %s: %s%s%s: %s%s%s\n", HELPER_NAME, what, detail ? " " : "", detail ? detail : "",
            strerror(errno), fix ? "; " : "", fix ? fix : "");
    _exit(FAILED);
}

static void fail(const char *what, const char *detail) { fail_fix(what, detail, NULL); }

static void usage(void) {
    fprintf(stderr, "usage: %s\n", HELPER_USAGE);
    _exit(FAILED);
}

/* a non-negative decimal argument, or usage() */
static long number(const char *text) {
    char *end;
    errno = 0;
    long n = strtol(text, &end, 10);
    if (errno || *text == '\0' || *end != '\0' || n < 0) usage();
    return n;
}

/* TEXT written whole to /proc/PID/FILE (an id map) */
static void put(pid_t pid, const char *file, const char *text) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail("open", path);
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) fail("write", path);
    close(fd);
}

/* A child in a new user namespace, whose maps the caller writes: it stays in it until the caller closes
 * *HOLD_OUT (or dies), so that the namespace lives until the caller holds it by other means. */
static pid_t start_holder(int *hold_out) {
    int ready[2], hold[2];
    if (pipe2(ready, O_CLOEXEC) || pipe2(hold, O_CLOEXEC)) fail("pipe", NULL);
    pid_t pid = fork();
    if (pid < 0) fail("fork", NULL);
    if (pid == 0) {
        char byte = 'R';
        close(ready[0]);
        close(hold[1]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (unshare(CLONE_NEWUSER)) _exit(FAILED);
        if (write(ready[1], &byte, 1) != 1) _exit(FAILED);
        while (read(hold[0], &byte, 1) > 0) {
        }
        _exit(0);
    }
    close(ready[1]);
    close(hold[0]);
    char byte;
    if (read(ready[0], &byte, 1) != 1) {
        errno = ECHILD;
        fail("making a user namespace", NULL);
    }
    close(ready[0]);
    *hold_out = hold[1];
    return pid;
}

/* /proc/PID/ns/user opened: the holder's namespace, kept alive by the descriptor */
static int namespace_of(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
    int userns = open(path, O_RDONLY | O_CLOEXEC);
    if (userns < 0) fail("open", path);
    return userns;
}

#endif
