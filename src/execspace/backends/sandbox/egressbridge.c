/* The egress bridge: the first program of a sandbox whose network is an allow-list.
 *
 * usage: egress-bridge CHANNEL_FD PORT -- PROGRAM [ARGS...]
 *
 * The sandbox has its own empty network namespace. This listens on 127.0.0.1:PORT there, hands the listening
 * socket to the egress proxy on the host over CHANNEL_FD (one end of a socketpair the host made, SCM_RIGHTS),
 * closes both and execs PROGRAM. Nothing of it stays: the proxy accepts the program's connections on that socket
 * itself, and the program never holds the channel (it cannot create unix sockets either: seccomp). */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fdpass.h"

static int fail(const char *what) {
    fprintf(stderr, "execspace egress bridge: %s: %s\n", what, strerror(errno));
    return 126;
}

int main(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[3], "--") != 0) {
        fprintf(stderr, "usage: egress-bridge CHANNEL_FD PORT -- PROGRAM [ARGS...]\n");
        return 126;
    }
    int channel = atoi(argv[1]);
    int port = atoi(argv[2]);
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return fail("socket");
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0) return fail("bind 127.0.0.1");
    if (listen(listener, 128) < 0) return fail("listen");

    char byte = 'L';
    if (send_with_fd(channel, &byte, 1, listener) != 1) return fail("handing the listener to the proxy");
    close(listener);
    close(channel);

    execvp(argv[4], argv + 4);
    fprintf(stderr, "execspace egress bridge: execvp %s: %s\n", argv[4], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
