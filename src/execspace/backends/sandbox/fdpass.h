/* Sending one message with one descriptor attached (SCM_RIGHTS), for the sandbox's helpers (supervisor.c,
 * egressbridge.c): each includes it, and its text is part of their build's cache key (supervisorbin.py). */
#ifndef EXECSPACE_FDPASS_H
#define EXECSPACE_FDPASS_H

#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

/* sendmsg's result for LEN bytes of BODY with FD attached */
static ssize_t send_with_fd(int chan, void *body, size_t len, int fd) {
    struct iovec iov = {body, len};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(chan, &msg, MSG_NOSIGNAL);
}

#endif
