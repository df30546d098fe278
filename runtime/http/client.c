/* An HTTP client of many requests at once (libcurl's multi interface), for load drivers and
 * the chat client: requests are added, run() moves all of them along, and each one's response
 * bytes are taken as they arrive, with the arrival time of each piece (a streamed answer's
 * tokens are timed where they land, not when the caller looks). */
#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#if LIBCURL_VERSION_NUM < 0x073A00
#error "libcurl >= 7.58 is needed: older ones send a custom Authorization header along a redirect to another host"
#endif

typedef struct transfer {
    CURL *easy;
    struct curl_slist *headers;
    char *body;             /* the request body (owned: curl reads it during the transfer) */
    char *data;             /* response bytes not yet taken */
    size_t len, cap;
    uint64_t *times;        /* per piece: its end offset in data and arrival (pairs) */
    size_t n_times, cap_times;
    char *head;             /* the response's header lines */
    size_t head_len;
    int done;               /* finished (status and error known) */
    long status;
    char error[CURL_ERROR_SIZE];
    int used;
} transfer;

struct loip_fetch {
    CURLM *multi;
    transfer **t;      /* each its own allocation: curl holds pointers to them */
    int32_t n, cap;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *userdata) {
    transfer *t = userdata;
    size_t n = size * nmemb;
    if (t->len + n > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + n) cap *= 2;
        char *d = realloc(t->data, cap);
        if (!d) return 0;
        t->data = d, t->cap = cap;
    }
    memcpy(t->data + t->len, ptr, n);
    t->len += n;
    if (t->n_times + 2 > t->cap_times) {
        size_t cap = t->cap_times ? t->cap_times * 2 : 64;
        uint64_t *x = realloc(t->times, cap * sizeof *x);
        if (!x) return 0;
        t->times = x, t->cap_times = cap;
    }
    t->times[t->n_times++] = t->len;
    t->times[t->n_times++] = loip_now_ns();
    return n;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata) {
    transfer *t = userdata;
    size_t n = size * nmemb;
    char *h = realloc(t->head, t->head_len + n + 1);
    if (!h) return 0;
    memcpy(h + t->head_len, ptr, n);
    t->head = h, t->head_len += n;
    h[t->head_len] = 0;
    return n;
}

LOIP_API int loip_fetch_new(loip_fetch **out) {
    *out = NULL;
    static int inited;
    if (!inited) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return loip_fail(LOIP_EIO, "http client: libcurl did not start");
        inited = 1;
    }
    loip_fetch *f = calloc(1, sizeof *f);
    if (!f || !(f->multi = curl_multi_init())) {
        free(f);
        return loip_fail(LOIP_ENOMEM, "http client: out of memory");
    }
    *out = f;
    return LOIP_OK;
}

static void transfer_clear(loip_fetch *f, transfer *t) {
    if (t->easy) {
        curl_multi_remove_handle(f->multi, t->easy);
        curl_easy_cleanup(t->easy);
    }
    curl_slist_free_all(t->headers);
    free(t->body);
    free(t->data);
    free(t->times);
    free(t->head);
    memset(t, 0, sizeof *t);
}

LOIP_API void loip_fetch_free(loip_fetch *f) {
    if (!f) return;
    for (int32_t i = 0; i < f->n; i++) {
        transfer_clear(f, f->t[i]);
        free(f->t[i]);
    }
    free(f->t);
    curl_multi_cleanup(f->multi);
    free(f);
}

LOIP_API int loip_fetch_add(loip_fetch *f, const char *url, const char *method, const char *headers,
                            const void *body, uint64_t len, int32_t timeout_ms, int32_t *id) {
    int32_t k = 0;
    while (k < f->n && f->t[k]->used) k++;
    if (k == f->n) {
        if (f->n == f->cap) {
            int32_t cap = f->cap ? f->cap * 2 : 16;
            transfer **t = realloc(f->t, (size_t)cap * sizeof *t);
            if (!t) return loip_fail(LOIP_ENOMEM, "http client: out of memory");
            f->t = t, f->cap = cap;
        }
        if (!(f->t[f->n] = calloc(1, sizeof(transfer)))) return loip_fail(LOIP_ENOMEM, "http client: out of memory");
        f->n++;
    }
    transfer *t = f->t[k];
    memset(t, 0, sizeof *t);
    t->used = 1;
    if (!(t->easy = curl_easy_init())) return loip_fail(LOIP_ENOMEM, "http client: out of memory");
    curl_easy_setopt(t->easy, CURLOPT_URL, url);
    curl_easy_setopt(t->easy, CURLOPT_CUSTOMREQUEST, method && *method ? method : "GET");
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->easy, CURLOPT_ERRORBUFFER, t->error);
    curl_easy_setopt(t->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(t->easy, CURLOPT_HEADERDATA, t);
    curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->easy, CURLOPT_TCP_NODELAY, 1L);
    /* Follow redirects (Hugging Face's resolve/ answers 302 to its CDN), a bounded number and
     * only to http(s). A custom Authorization header goes with a redirect to the same host
     * only: libcurl >= 7.58 drops it for another host (>= 7.83: another port or scheme too),
     * unless CURLOPT_UNRESTRICTED_AUTH, which is never set here: a token is not handed to the
     * CDN. */
    curl_easy_setopt(t->easy, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(t->easy, CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85: protocols by name */
    curl_easy_setopt(t->easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(t->easy, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    if (timeout_ms > 0) curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    t->headers = curl_slist_append(NULL, "Expect:"); /* no 100-continue round trip */
    if (headers) {
        char *copy = strdup(headers), *save = NULL;
        for (char *line = copy ? strtok_r(copy, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save))
            t->headers = curl_slist_append(t->headers, line);
        free(copy);
    }
    curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
    if (body) {
        if (!(t->body = malloc(len ? len : 1))) return loip_fail(LOIP_ENOMEM, "http client: out of memory");
        memcpy(t->body, body, len);
        curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, t->body);
        curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    if (curl_multi_add_handle(f->multi, t->easy) != CURLM_OK) {
        transfer_clear(f, t);
        return loip_fail(LOIP_EIO, "http client: cannot add %s", url);
    }
    *id = k;
    return LOIP_OK;
}

/* Move every transfer along, waiting up to timeout_ms for activity; returns how many run. */
LOIP_API int loip_fetch_run(loip_fetch *f, int32_t timeout_ms) {
    int running = 0;
    curl_multi_perform(f->multi, &running);
    if (running > 0 && timeout_ms > 0) {
        curl_multi_poll(f->multi, NULL, 0, timeout_ms, NULL);
        curl_multi_perform(f->multi, &running);
    }
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(f->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        for (int32_t i = 0; i < f->n; i++) {
            transfer *t = f->t[i];
            if (t->used && t->easy == m->easy_handle) {
                t->done = 1;
                curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
                if (m->data.result != CURLE_OK && !t->error[0])
                    snprintf(t->error, sizeof t->error, "%s", curl_easy_strerror(m->data.result));
            }
        }
    }
    return running;
}

/* Take up to cap response bytes of transfer id into buf; *arrived: when the last byte taken
 * arrived (ns, loip_now_ns). Returns how many. */
LOIP_API int64_t loip_fetch_take(loip_fetch *f, int32_t id, char *buf, uint64_t cap, uint64_t *arrived) {
    if (id < 0 || id >= f->n || !f->t[id]->used) return loip_fail(LOIP_EINVAL, "http client: no transfer %d", id);
    transfer *t = f->t[id];
    size_t n = t->len < cap ? t->len : (size_t)cap;
    uint64_t when = 0;
    size_t keep = 0;
    for (size_t i = 0; i < t->n_times; i += 2) {
        if (t->times[i] <= n) {
            when = t->times[i + 1];
        } else {
            if (!when && n > 0) when = t->times[i + 1]; /* only part of this piece is taken */
            t->times[keep++] = t->times[i] - n;
            t->times[keep++] = t->times[i + 1];
        }
    }
    if (arrived) *arrived = when;
    t->n_times = keep;
    if (n) { /* nothing arrived yet: data may still be NULL */
        memcpy(buf, t->data, n);
        memmove(t->data, t->data + n, t->len - n);
    }
    t->len -= n;
    return (int64_t)n;
}

/* The transfer's state: 1 done (*status: the HTTP status, 0 when none came; error text in
 * err), 0 still running. */
LOIP_API int loip_fetch_state(loip_fetch *f, int32_t id, int32_t *status, char *err, size_t cap) {
    if (id < 0 || id >= f->n || !f->t[id]->used) return loip_fail(LOIP_EINVAL, "http client: no transfer %d", id);
    transfer *t = f->t[id];
    *status = (int32_t)t->status;
    if (err && cap) snprintf(err, cap, "%s", t->error);
    return t->done;
}

/* The response's header lines so far into buf (NUL-terminated); their length. */
LOIP_API int64_t loip_fetch_headers(loip_fetch *f, int32_t id, char *buf, uint64_t cap) {
    if (id < 0 || id >= f->n || !f->t[id]->used || !cap) return 0;
    transfer *t = f->t[id];
    size_t n = t->head_len < cap - 1 ? t->head_len : (size_t)cap - 1;
    if (n) memcpy(buf, t->head, n);
    buf[n] = 0;
    return (int64_t)n;
}

/* Drop a transfer (a client that hangs up when it is still running). */
LOIP_API void loip_fetch_close(loip_fetch *f, int32_t id) {
    if (id < 0 || id >= f->n || !f->t[id]->used) return;
    transfer_clear(f, f->t[id]);
}
