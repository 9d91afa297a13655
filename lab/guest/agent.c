/*
 * densevm-agent: runs commands for the host over vsock (docs/vsock.md, "The guest agent").
 *
 * Listens on a vsock stream port (default 52; `densevm-agent [PORT]`; a unix socket for
 * host-side tests: `densevm-agent --unix PATH`) and serves each connection in a process of
 * its own: one request frame (timeout, argv, environment), then stdin frames from the
 * host, stdout/stderr frames back, and an exit frame.
 *
 * Frames: u8 type, u32 length (little-endian), then that many bytes.
 *   host -> agent  'R' request: u32 timeout_ms (0: none), u32 argc, u32 envc, then argc +
 *                      envc NUL-terminated strings (argv first, then "NAME=VALUE")
 *                  'I' stdin bytes   'C' end of stdin (length 0)
 *   agent -> host  'O' stdout bytes  'E' stderr bytes
 *                  'X' exit: i32 code, u8 how (0 exited, 1 killed by a signal (code is
 *                      128 + signal), 2 timed out and killed (code 124), 3 could not
 *                      start (code 126/127)), then a message (may be empty)
 *
 * Built statically by lab/guest/build.sh (`make guest`); no dependencies beyond libc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#define MAX_REQUEST (1u << 20)
#define MAX_STDIN_FRAME (1u << 20)
#define CHUNK 65536
#define REQUEST_WAIT_MS 10000

static const char *default_env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                    "HOME=/root", NULL};

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads exactly len bytes, waiting at most wait_ms in all (-1: no limit). */
static int read_all(int fd, void *buf, size_t len, int wait_ms) {
    char *p = buf;
    while (len > 0) {
        if (wait_ms >= 0) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            int r = poll(&pfd, 1, wait_ms);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return -1;
        }
        ssize_t n = read(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int send_frame(int fd, char type, const void *data, uint32_t len) {
    unsigned char hdr[5] = {(unsigned char)type, len & 0xff, (len >> 8) & 0xff, (len >> 16) & 0xff,
                            (len >> 24) & 0xff};
    if (write_all(fd, hdr, 5) < 0) return -1;
    return len ? write_all(fd, data, len) : 0;
}

static int send_exit(int fd, int32_t code, unsigned char how, const char *msg) {
    size_t mlen = msg ? strlen(msg) : 0;
    if (mlen > 4000) mlen = 4000;
    unsigned char buf[4 + 1 + 4000];
    uint32_t c = (uint32_t)code;
    buf[0] = c & 0xff, buf[1] = (c >> 8) & 0xff, buf[2] = (c >> 16) & 0xff, buf[3] = c >> 24;
    buf[4] = how;
    if (mlen) memcpy(buf + 5, msg, mlen);
    return send_frame(fd, 'X', buf, (uint32_t)(5 + mlen));
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Splits the request's strings; returns NULL-terminated arrays or -1 when malformed. */
static int parse_request(unsigned char *req, uint32_t len, uint32_t *timeout_ms, char ***argv,
                         char ***envp) {
    if (len < 12) return -1;
    *timeout_ms = le32(req);
    uint32_t argc = le32(req + 4), envc = le32(req + 8);
    if (argc == 0 || argc > len || envc > len) return -1;
    char **a = calloc((size_t)argc + 1, sizeof(char *));
    char **e = calloc((size_t)envc + 1, sizeof(char *));
    if (!a || !e) return -1;
    char *p = (char *)req + 12, *end = (char *)req + len;
    for (uint32_t i = 0; i < argc + envc; i++) {
        char *nul = memchr(p, 0, (size_t)(end - p));
        if (!nul) return -1;
        if (i < argc)
            a[i] = p;
        else
            e[i - argc] = p;
        p = nul + 1;
    }
    if (p != end) return -1;
    *argv = a;
    *envp = envc ? e : (char **)default_env;
    return 0;
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void serve(int conn) {
    unsigned char hdr[5];
    if (read_all(conn, hdr, 5, REQUEST_WAIT_MS) < 0 || hdr[0] != 'R') return;
    uint32_t len = le32(hdr + 1);
    if (len > MAX_REQUEST) {
        send_exit(conn, 126, 3, "request too large");
        return;
    }
    unsigned char *req = malloc(len + 1);
    if (!req || read_all(conn, req, len, REQUEST_WAIT_MS) < 0) return;
    uint32_t timeout_ms;
    char **argv, **envp;
    if (parse_request(req, len, &timeout_ms, &argv, &envp) < 0) {
        send_exit(conn, 126, 3, "malformed request");
        return;
    }
    int in[2], out[2], err[2], status_pipe[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
        pipe2(status_pipe, O_CLOEXEC)) {
        send_exit(conn, 126, 3, "cannot create pipes");
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        send_exit(conn, 126, 3, "cannot fork");
        return;
    }
    if (pid == 0) {
        setsid();
        signal(SIGPIPE, SIG_DFL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        execvpe(argv[0], argv, envp);
        int e = errno;
        write_all(status_pipe[1], &e, sizeof e);
        _exit(e == ENOENT ? 127 : 126);
    }
    close(in[0]), close(out[1]), close(err[1]), close(status_pipe[1]);
    int exec_errno = 0;
    if (read_all(status_pipe[0], &exec_errno, sizeof exec_errno, -1) == 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "cannot execute %s: %s", argv[0], strerror(exec_errno));
        waitpid(pid, NULL, 0);
        send_exit(conn, exec_errno == ENOENT ? 127 : 126, 3, msg);
        return;
    }
    close(status_pipe[0]);
    set_nonblock(in[1]);
    long long deadline = timeout_ms ? now_ms() + timeout_ms : -1;
    int stdin_fd = in[1], out_fd = out[0], err_fd = err[0];
    int timed_out = 0, exited = 0, wstatus = 0;
    /* stdin bytes read from the host and not yet taken by the command */
    static unsigned char pend[MAX_STDIN_FRAME];
    size_t pend_len = 0, pend_off = 0;
    uint32_t frame_left = 0; /* bytes of the current 'I' frame still to read */
    static unsigned char buf[CHUNK];
    while (out_fd >= 0 || err_fd >= 0 || !exited) {
        if (!exited) {
            pid_t r = waitpid(pid, &wstatus, WNOHANG);
            if (r == pid) exited = 1;
        }
        if (exited && out_fd < 0 && err_fd < 0) break;
        if (deadline >= 0 && !timed_out && now_ms() >= deadline) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            timed_out = 1;
        }
        /* Block on the pipes and the host; poll for the exit once the pipes are closed. */
        int wait = (out_fd < 0 && err_fd < 0) ? 50 : -1;
        if (deadline >= 0 && !timed_out) {
            long long left = deadline - now_ms();
            if (left < 0) left = 0;
            if (wait < 0 || left < wait) wait = (int)(left > 60000 ? 60000 : left);
        }
        struct pollfd p[4];
        int n = 0, i_conn = -1, i_out = -1, i_err = -1, i_in = -1;
        if (pend_len == 0) p[i_conn = n++] = (struct pollfd){conn, POLLIN, 0};
        if (out_fd >= 0) p[i_out = n++] = (struct pollfd){out_fd, POLLIN, 0};
        if (err_fd >= 0) p[i_err = n++] = (struct pollfd){err_fd, POLLIN, 0};
        if (stdin_fd >= 0 && pend_len > 0) p[i_in = n++] = (struct pollfd){stdin_fd, POLLOUT, 0};
        int r = poll(p, (nfds_t)n, wait);
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        if (i_out >= 0 && p[i_out].revents) {
            ssize_t got = read(out_fd, buf, sizeof buf);
            if (got > 0) {
                if (send_frame(conn, 'O', buf, (uint32_t)got) < 0) goto host_gone;
            } else if (got == 0 || errno != EINTR) {
                close(out_fd), out_fd = -1;
            }
        }
        if (i_err >= 0 && p[i_err].revents) {
            ssize_t got = read(err_fd, buf, sizeof buf);
            if (got > 0) {
                if (send_frame(conn, 'E', buf, (uint32_t)got) < 0) goto host_gone;
            } else if (got == 0 || errno != EINTR) {
                close(err_fd), err_fd = -1;
            }
        }
        if (i_in >= 0 && p[i_in].revents) {
            ssize_t put = write(stdin_fd, pend + pend_off, pend_len);
            if (put > 0) {
                pend_off += (size_t)put, pend_len -= (size_t)put;
            } else if (put < 0 && errno != EAGAIN && errno != EINTR) {
                /* The command closed its stdin: drop what it did not take. */
                close(stdin_fd), stdin_fd = -1, pend_len = 0;
            }
        }
        if (i_conn >= 0 && p[i_conn].revents) {
            if (frame_left == 0) {
                if (read_all(conn, hdr, 5, REQUEST_WAIT_MS) < 0) goto host_gone;
                uint32_t flen = le32(hdr + 1);
                if (hdr[0] == 'C' && flen == 0) {
                    if (stdin_fd >= 0) close(stdin_fd), stdin_fd = -1;
                } else if (hdr[0] == 'I' && flen <= MAX_STDIN_FRAME) {
                    frame_left = flen;
                } else {
                    goto host_gone;
                }
            } else {
                ssize_t got = read(conn, pend, frame_left);
                if (got <= 0) {
                    if (got < 0 && errno == EINTR) continue;
                    goto host_gone;
                }
                frame_left -= (uint32_t)got;
                /* Stdin the command closed (or after the end of stdin) is dropped. */
                pend_off = 0, pend_len = stdin_fd >= 0 ? (size_t)got : 0;
            }
        }
    }
    if (!exited) waitpid(pid, &wstatus, 0);
    if (timed_out) {
        char msg[128];
        snprintf(msg, sizeof msg, "timed out after %u ms and was killed", timeout_ms);
        send_exit(conn, 124, 2, msg);
    } else if (WIFSIGNALED(wstatus)) {
        send_exit(conn, 128 + WTERMSIG(wstatus), 1, strsignal(WTERMSIG(wstatus)));
    } else {
        send_exit(conn, WEXITSTATUS(wstatus), 0, "");
    }
    return;
host_gone:
    /* The host went away: end the command with it. */
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

int main(int argc, char **argv) {
    int s;
    unsigned port = 52;
    if (argc > 2 && strcmp(argv[1], "--unix") == 0) {
        /* Host-side tests: the same service on a unix socket. */
        struct sockaddr_un ua = {.sun_family = AF_UNIX};
        if (strlen(argv[2]) >= sizeof ua.sun_path) return 2;
        strcpy(ua.sun_path, argv[2]);
        s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0 || bind(s, (struct sockaddr *)&ua, sizeof ua) < 0 || listen(s, 16) < 0) {
            perror("densevm-agent: unix socket");
            return 1;
        }
    } else {
        if (argc > 1) port = (unsigned)strtoul(argv[1], NULL, 10);
        s = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) {
            perror("densevm-agent: socket(AF_VSOCK) (load vmw_vsock_virtio_transport)");
            return 1;
        }
        struct sockaddr_vm addr = {.svm_family = AF_VSOCK, .svm_port = port, .svm_cid = VMADDR_CID_ANY};
        if (bind(s, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(s, 16) < 0) {
            perror("densevm-agent: bind/listen");
            return 1;
        }
    }
    /* Connection processes are reaped by the kernel. */
    signal(SIGCHLD, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "densevm-agent: listening on vsock port %u\n", port);
    for (;;) {
        int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            perror("densevm-agent: accept");
            sleep(1);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(s);
            signal(SIGCHLD, SIG_DFL);
            serve(c);
            close(c);
            _exit(0);
        }
        close(c);
    }
}
