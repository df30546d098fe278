/* Internal: the transport's context, sockets and the helpers its files share (auth.c: the
 * context and its ZAP handler; sockets.c: framed checked messages, link emulation, link
 * statistics; heartbeat.c: the PING/PONG thread). See transport/sockets.c for the design. */
#ifndef LOIP_TRANSPORT_NET_H
#define LOIP_TRANSPORT_NET_H

#include <pthread.h>
#include <zmq.h>

#include "loip.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define MAX_PEERS 32
#define AUTH_LOG_LINES 64

struct loip_net {
    void *ctx;
    char public_z85[41], secret_z85[41];
    uint8_t allowed[MAX_PEERS][32]; /* client keys the ZAP handler accepts */
    int n_allowed;
    pthread_t zap_thread;
    int zap_ok;
    void *zap_ready; /* bound before any socket exists */
    pthread_mutex_t mu;
    char log[AUTH_LOG_LINES][200];
    int n_log;
    int dropped_log;
    struct loip_sock *socks; /* open sockets (under mu): closed by loip_net_free if still open */
};

typedef struct peer {
    char id[64];
    loip_link_stats st;
} peer;

struct loip_sock {
    loip_net *net;   /* NULL once the net is freed (the socket is closed then) */
    struct loip_sock *prev, *next; /* in the net's list */
    int thread_owned; /* a heartbeat thread's: it closes the socket itself on ETERM */
    /* client: the handshake's state from the monitor: connected, and whether it ever succeeded;
     * refused counts connections the server dropped before a handshake succeeded (a wrong
     * cluster token or key: the server cannot read ours) */
    int connected, handshaken, refused;
    void *z;
    void *mon;   /* server: the socket monitor's events (failed handshakes are logged) */
    char endpoint[256];
    int server;
    uint64_t rate_bps, delay_ns, wire_free_ns;
    uint64_t spin_ns; /* an emulated delivery sleeps until this long before its time, then
                         spins: the timer's lateness would add to every emulated hop (0: sleep
                         only; loip_sock_emulate_spin, measured by a profile) */
    double weight;    /* of a new sample in the link statistics' moving averages (1: none) */
    peer peers[MAX_PEERS];
    int n_peers;
};

/* code, with what failed and libzmq's reason as the last error. */
int loip_zfail(int code, const char *what);
/* A line into n's refusal log (loip_net_auth_log reads it); thread-safe. */
void loip_auth_log(loip_net *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* n bytes of a message libzmq received, into dst (told to ThreadSanitizer as no race). */
void loip_zmsg_copy(void *dst, zmq_msg_t *m, size_t n);
/* s's ZeroMQ sockets closed (s stays, closed: every use refused). */
void loip_sock_close_z(loip_sock *s);

#endif
