/* One run of Kineto events (a JSON array of event objects) -> the stored events columns as Arrow
 * buffers, in one pass over the bytes, without the GIL; DuckDB reads them through the Arrow C stream
 * interface (Run.__arrow_c_stream__) and writes the Parquet part (kineto._write_decoded).
 *
 * The fast path of tracekit/ingest/kineto.py (_write_events). It gives exactly what the general path
 * (DuckDB's read_json plus the typed SQL, _typed_sql) gives, or nothing: on anything that path treats
 * in a way this one does not reproduce (a malformed or non-object event, a repeated key, a ts written
 * as text, a pid that is a float or a boolean, an escaped key, invalid UTF-8, nesting beyond
 * MAX_DEPTH, a timestamp tie that DuckDB's decimal rounding decides ...) decode() returns None and the
 * caller takes the general path, which also names the bad event. (A lone surrogate escape, \ud800, is
 * declined too; the reader then replaces it with U+FFFD's and hands the run over again: reader._run.)
 *
 * The rules it reproduces (tests/test_ingest_fastpath.py checks that both paths agree, on generated
 * runs and on every real trace):
 * - ph, cat, name, bp, s: the unescaped string; absent or null -> NULL;
 * - pid, tid, id: an integer (JSON integer, or a string that prints back as one) -> the integer
 *   column, another string -> the label column;
 * - ts, dur: microseconds -> ns: whole values exactly, others round(us * 1000) of the double; a run
 *   holding a fractional ts of 13+ integer digits reads every ts as an exact decimal instead (of the
 *   ts text when some ts needs that: _exact_ts);
 * - args_json: the args object as yyjson (DuckDB) writes it back: no whitespace, numbers as given
 *   when integers, else the shortest text that reads back as the same double (JavaScript's form,
 *   whole values with ".0"), strings with only '"', '\\' and control characters escaped;
 * - the common args (external_id ... concrete_inputs), on events other than metadata (ph M) and
 *   [memory] events: integers as BIGINT, arrays and objects as their written-back JSON; a value of
 *   another JSON type (a stream "0x0", a float id) goes to the _deferred column as {"key": value},
 *   which json_transform converts as on the general path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const char *s, size_t n) {
    if (b->len + n > b->cap && buf_reserve(b, n)) return -1;
    char *d = b->p + b->len;
    if (n <= 16) /* most pieces are a few bytes: a call to memcpy costs more than the copy */
        for (size_t i = 0; i < n; i++) d[i] = s[i];
    else memcpy(d, s, n);
    b->len += n;
    return 0;
}

static inline int buf_putc(Buf *b, char c) {
    if (b->len == b->cap && buf_reserve(b, 1)) return -1;
    b->p[b->len++] = c;
    return 0;
}

/* Columns, in the order of STORED_EVENT_COLUMNS after event_id. */
enum {
    C_PH, C_CAT, C_NAME, C_PID, C_TID, C_PID_LABEL, C_TID_LABEL, C_TS, C_DUR, C_FLOW_ID, C_FLOW_LABEL,
    C_BP, C_SCOPE,
    C_EXTERNAL_ID, C_CORRELATION, C_DEVICE, C_STREAM, C_CBID, C_EV_IDX, C_RECORD_FUNCTION_ID,
    C_SEQUENCE_NUMBER, C_FWD_THREAD_ID, C_INPUT_DIMS, C_INPUT_TYPES, C_INPUT_STRIDES, C_CONCRETE_INPUTS,
    C_ARGS_JSON, C_DEFERRED, N_COLS
};
#define N_COMMON_INT 9
#define N_COMMON_STR 4
static const char *COMMON_KEYS[N_COMMON_INT + N_COMMON_STR] = {
    "External id", "correlation", "device", "stream", "cbid", "Ev Idx", "Record function id",
    "Sequence number", "Fwd thread id", "Input Dims", "Input type", "Input Strides", "Concrete Inputs"};
static size_t COMMON_LEN[N_COMMON_INT + N_COMMON_STR]; /* strlen of each, set at import */
static const char IS_STR[N_COLS] = {1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1};

typedef struct {
    Buf data;   /* string bytes, or int64 values */
    Buf offs;   /* int32 offsets (strings) */
    Buf valid;  /* one byte per row, packed into a bitmap at the end */
} Col;

typedef struct {
    const char *p, *end;
    Col cols[N_COLS];
    Buf ts_exact;      /* int64 per row: ts as an exact decimal (when the run needs that reading) */
    Buf ts_exact_ok;   /* one byte per row: TS_* below */
    Buf defer;         /* the event's common args of another JSON type than their column, as "key":value */
    size_t deferred;   /* rows with such args (json_transform converts them, see kineto._write_decoded) */
    Buf scratch;       /* skipped values */
    size_t rows;
    int big_fractional_ts;  /* a "ts" of 13+ integer digits with a fraction */
    int ts_text_needed;     /* ... one whose exact value needs its text (the general path's _exact_ts) */
    int64_t first_id;
    int64_t base;
    /* per event */
    int64_t ival[N_COLS];
    char have[N_COLS];
    size_t common_start[N_COMMON_STR], common_len[N_COMMON_STR];
    char common_have[N_COMMON_INT + N_COMMON_STR];
    int64_t common_int[N_COMMON_INT];
} St;

#define BAIL return -1

static inline void ws(St *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int put_utf8(Buf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) { t[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    return buf_put(b, t, n);
}

/* Length of a valid UTF-8 sequence starting at p (its first byte >= 0x80), or 0. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if ((size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n;
}

/* A JSON string at s->p (the opening quote). raw: the unescaped bytes go there; json: the string as
 * yyjson writes it goes there (either may be NULL). has_escape: set when the text held a backslash. */
static int parse_string(St *s, Buf *raw, Buf *json, int *has_escape) {
    const unsigned char *p = (const unsigned char *)s->p + 1, *end = (const unsigned char *)s->end;
    if (json && buf_putc(json, '"')) BAIL;
    for (;;) {
        const unsigned char *run = p;
        while (p < end && *p != '"' && *p != '\\' && *p >= 0x20 && *p < 0x80) p++;
        if (p > run) {
            if (raw && buf_put(raw, (const char *)run, p - run)) BAIL;
            if (json && buf_put(json, (const char *)run, p - run)) BAIL;
        }
        if (p >= end) BAIL;
        unsigned c = *p;
        if (c == '"') { p++; break; }
        if (c < 0x20) BAIL; /* raw control character: not JSON */
        if (c >= 0x80) {
            size_t n = utf8_len(p, end);
            if (!n) BAIL;
            if (raw && buf_put(raw, (const char *)p, n)) BAIL;
            if (json && buf_put(json, (const char *)p, n)) BAIL;
            p += n;
            continue;
        }
        /* backslash */
        if (has_escape) *has_escape = 1;
        if (p + 1 >= end) BAIL;
        uint32_t cp;
        switch (p[1]) {
            case '"': cp = '"'; p += 2; break;
            case '\\': cp = '\\'; p += 2; break;
            case '/': cp = '/'; p += 2; break;
            case 'b': cp = '\b'; p += 2; break;
            case 'f': cp = '\f'; p += 2; break;
            case 'n': cp = '\n'; p += 2; break;
            case 'r': cp = '\r'; p += 2; break;
            case 't': cp = '\t'; p += 2; break;
            case 'u': {
                if (end - p < 6) BAIL;
                int h[4];
                for (int i = 0; i < 4; i++) if ((h[i] = hexval(p[2 + i])) < 0) BAIL;
                cp = (uint32_t)((h[0] << 12) | (h[1] << 8) | (h[2] << 4) | h[3]);
                p += 6;
                if (cp >= 0xDC00 && cp <= 0xDFFF) BAIL; /* lone low surrogate */
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u') BAIL;
                    int l[4];
                    for (int i = 0; i < 4; i++) if ((l[i] = hexval(p[2 + i])) < 0) BAIL;
                    uint32_t lo = (uint32_t)((l[0] << 12) | (l[1] << 8) | (l[2] << 4) | l[3]);
                    if (lo < 0xDC00 || lo > 0xDFFF) BAIL;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                }
                if (cp == 0) BAIL; /* NUL inside a string: leave it to the general path */
                break;
            }
            default: BAIL;
        }
        if (raw && put_utf8(raw, cp)) BAIL;
        if (json) {
            static const char hex[] = "0123456789ABCDEF";
            char e[6];
            switch (cp) {
                case '"': if (buf_put(json, "\\\"", 2)) BAIL; break;
                case '\\': if (buf_put(json, "\\\\", 2)) BAIL; break;
                case '\b': if (buf_put(json, "\\b", 2)) BAIL; break;
                case '\f': if (buf_put(json, "\\f", 2)) BAIL; break;
                case '\n': if (buf_put(json, "\\n", 2)) BAIL; break;
                case '\r': if (buf_put(json, "\\r", 2)) BAIL; break;
                case '\t': if (buf_put(json, "\\t", 2)) BAIL; break;
                default:
                    if (cp < 0x20) {
                        e[0] = '\\'; e[1] = 'u'; e[2] = '0'; e[3] = '0'; e[4] = hex[cp >> 4]; e[5] = hex[cp & 15];
                        if (buf_put(json, e, 6)) BAIL;
                    } else if (put_utf8(json, cp)) BAIL;
            }
        }
    }
    if (json && buf_putc(json, '"')) BAIL;
    s->p = (const char *)p;
    return 0;
}

/* A JSON number at s->p: its extent, whether it is an integer literal, and its integer parts. */
typedef struct {
    const char *start;
    size_t len;
    int is_int;        /* no fraction, no exponent */
    int neg;
    size_t int_digits, frac_digits;
    const char *int_start, *frac_start;
    int has_exp;
} Num;

static int scan_number(St *s, Num *n) {
    const char *p = s->p, *end = s->end;
    memset(n, 0, sizeof *n);
    n->start = p;
    if (p < end && *p == '-') { n->neg = 1; p++; }
    if (p >= end) BAIL;
    n->int_start = p;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < end && *p >= '0' && *p <= '9') p++;
    else BAIL;
    n->int_digits = p - n->int_start;
    if (p < end && *p == '.') {
        p++;
        n->frac_start = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        n->frac_digits = p - n->frac_start;
        if (!n->frac_digits) BAIL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        n->has_exp = 1;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const char *d = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == d) BAIL;
    }
    n->is_int = !n->frac_start && !n->has_exp;
    n->len = p - n->start;
    s->p = p;
    return 0;
}

static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The digits of a plain decimal (no exponent) as an integer mantissa, when it stays below 2^53. */
static int plain_mantissa(const Num *n, uint64_t *m) {
    if (n->has_exp || n->int_digits + n->frac_digits > 19) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n->int_digits; i++) v = v * 10 + (uint64_t)(n->int_start[i] - '0');
    for (size_t i = 0; i < n->frac_digits; i++) v = v * 10 + (uint64_t)(n->frac_start[i] - '0');
    if (v >= (1ull << 53)) return 0;
    *m = v;
    return 1;
}

static double num_double(const Num *n) {
    uint64_t m;
    /* Clinger's fast path: an exact mantissa over an exact power of ten is one correctly rounded
     * division, the double strtod gives */
    if (n->frac_digits <= 22 && plain_mantissa(n, &m)) {
        double d = (double)m / POW10[n->frac_digits];
        return n->neg ? -d : d;
    }
    char tmp[64];
    if (n->len < sizeof tmp) {
        memcpy(tmp, n->start, n->len);
        tmp[n->len] = 0;
        return strtod(tmp, NULL);
    }
    char *t = malloc(n->len + 1);
    if (!t) return NAN;
    memcpy(t, n->start, n->len);
    t[n->len] = 0;
    double d = strtod(t, NULL);
    free(t);
    return d;
}

/* An integer literal as int64, when it is one and fits (and is not "-0"). */
static int num_int64(const Num *n, int64_t *out) {
    if (!n->is_int || n->int_digits > 19) return 0;
    if (n->neg && n->int_digits == 1 && n->int_start[0] == '0') return 0;
    uint64_t v = 0; /* 19 digits stay below 1e19 < 2^64: no overflow */
    for (size_t i = 0; i < n->int_digits; i++) v = v * 10 + (uint64_t)(n->int_start[i] - '0');
    if (v > (uint64_t)INT64_MAX + (uint64_t)n->neg) return 0;
    *out = n->neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

/* The shortest text that reads back as d, as yyjson writes a double (JavaScript's Number form, with
 * ".0" on whole values written without an exponent). */
static int put_double(Buf *b, double d) {
    if (!isfinite(d)) BAIL;
    if (d == 0) return signbit(d) ? buf_put(b, "-0.0", 4) : buf_put(b, "0.0", 3);
    /* d rounded to 15 significant digits reads back as d when any shorter text does (then it is that
     * text with zeros after it); else 16, else 17 digits: the closest decimal of the fewest digits */
    char t[40];
    for (int prec = fabs(d) < DBL_MIN ? 1 : 15; prec <= 17; prec++) { /* subnormals hold fewer digits */
        snprintf(t, sizeof t, "%.*e", prec - 1, d);
        if (strtod(t, NULL) == d) break;
    }
    /* t: [-]D[.DDD]e[+-]XX -> digits and exponent */
    char digits[24];
    int nd = 0, neg = 0;
    const char *q = t;
    if (*q == '-') { neg = 1; q++; }
    for (; *q && *q != 'e'; q++) if (*q != '.') digits[nd++] = *q;
    int e10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg && buf_putc(b, '-')) BAIL;
    if (e10 >= -6 && e10 < 21) {
        if (e10 < 0) {
            if (buf_put(b, "0.", 2)) BAIL;
            for (int i = 0; i < -e10 - 1; i++) if (buf_putc(b, '0')) BAIL;
            if (buf_put(b, digits, nd)) BAIL;
        } else if (nd <= e10 + 1) {
            if (buf_put(b, digits, nd)) BAIL;
            for (int i = nd; i < e10 + 1; i++) if (buf_putc(b, '0')) BAIL;
            if (buf_put(b, ".0", 2)) BAIL;
        } else {
            if (buf_put(b, digits, e10 + 1) || buf_putc(b, '.') || buf_put(b, digits + e10 + 1, nd - e10 - 1)) BAIL;
        }
    } else {
        if (buf_putc(b, digits[0])) BAIL;
        if (nd > 1 && (buf_putc(b, '.') || buf_put(b, digits + 1, nd - 1))) BAIL;
        char e[8];
        int k = snprintf(e, sizeof e, "e%d", e10);
        if (buf_put(b, e, k)) BAIL;
    }
    return 0;
}

/* A decimal literal that is already the text yyjson writes for its double: no exponent, at most 15
 * significant digits (two such decimals never share a double, so it is the shortest one), no trailing
 * zero after the point but in "X.0", and in the range written without an exponent (>= 1e-6). */
static int canonical_decimal(const Num *n) {
    if (n->has_exp || !n->frac_start) return 0;
    const char *f = n->frac_start;
    size_t fd = n->frac_digits;
    if (f[fd - 1] == '0' && fd != 1) return 0; /* only "X.0" may end in zero */
    size_t sig;
    if (n->int_digits == 1 && n->int_start[0] == '0') {
        size_t z = 0;
        while (z < fd && f[z] == '0') z++;
        if (z == fd) return fd == 1; /* 0.0 (and -0.0) */
        if (z > 5) return 0;         /* below 1e-6: yyjson writes an exponent */
        sig = fd - z;
    } else sig = n->int_digits + (fd == 1 && f[0] == '0' ? 0 : fd);
    return sig <= 15;
}

static int put_number(Buf *b, const Num *n) {
    if (n->is_int) {
        if (n->neg && n->int_digits == 1 && n->int_start[0] == '0') return buf_putc(b, '0');
        return buf_put(b, n->start, n->len);
    }
    if (canonical_decimal(n)) return buf_put(b, n->start, n->len);
    return put_double(b, num_double(n));
}

/* The "ts" checks of the general path's regular expressions (_BIG_FRACTIONAL_TS, _TS_TEXT_NEEDED). */
static void note_ts_text(St *s, const Num *n) {
    if (!n->frac_start) return;
    size_t d = n->int_digits;
    if (d >= 13) s->big_fractional_ts = 1;
    if (d >= 14 || (d == 13 && (n->int_start[0] == '8' || n->int_start[0] == '9' || n->frac_digits >= 4)))
        s->ts_text_needed = 1;
}

static int parse_value(St *s, Buf *json, int depth);


/* An object or array, written back into json (a nested "ts" is checked as the regexes do). */
static int parse_container(St *s, Buf *json, int depth) {
    if (depth > MAX_DEPTH) BAIL;
    char open = *s->p, close = open == '{' ? '}' : ']';
    if (buf_putc(json, open)) BAIL;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return buf_putc(json, close);
    }
    for (int first = 1;; first = 0) {
        if (!first && buf_putc(json, ',')) BAIL;
        ws(s);
        int ts_key = 0;
        if (open == '{') {
            if (s->p >= s->end || *s->p != '"') BAIL;
            const char *k = s->p + 1;
            int esc = 0;
            if (parse_string(s, NULL, json, &esc)) BAIL;
            if (esc) BAIL; /* an escaped key could end in what the regexes read as "ts" */
            ts_key = (size_t)(s->p - k - 1) == 2 && k[0] == 't' && k[1] == 's';
            ws(s);
            if (s->p >= s->end || *s->p != ':') BAIL;
            s->p++;
            if (buf_putc(json, ':')) BAIL;
            ws(s);
        }
        if (ts_key && s->p < s->end && (*s->p == '-' || (*s->p >= '0' && *s->p <= '9'))) {
            Num n;
            if (scan_number(s, &n)) BAIL;
            note_ts_text(s, &n);
            if (put_number(json, &n)) BAIL;
        } else if (parse_value(s, json, depth + 1)) BAIL;
        ws(s);
        if (s->p >= s->end) BAIL;
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == close) { s->p++; break; }
        BAIL;
    }
    return buf_putc(json, close);
}

static int parse_value(St *s, Buf *json, int depth) {
    if (s->p >= s->end) BAIL;
    char c = *s->p;
    if (c == '"') return parse_string(s, NULL, json, NULL);
    if (c == '{' || c == '[') return parse_container(s, json, depth);
    if (c == '-' || (c >= '0' && c <= '9')) {
        Num n;
        if (scan_number(s, &n)) BAIL;
        return put_number(json, &n);
    }
    if (s->end - s->p >= 4 && memcmp(s->p, "true", 4) == 0) { s->p += 4; return buf_put(json, "true", 4); }
    if (s->end - s->p >= 5 && memcmp(s->p, "false", 5) == 0) { s->p += 5; return buf_put(json, "false", 5); }
    if (s->end - s->p >= 4 && memcmp(s->p, "null", 4) == 0) { s->p += 4; return buf_put(json, "null", 4); }
    BAIL;
}

static inline int is_null(St *s) {
    if (s->end - s->p >= 4 && memcmp(s->p, "null", 4) == 0) { s->p += 4; return 1; }
    return 0;
}

/* ph, cat, name, bp, s: the string's bytes into the column. */
static int field_string(St *s, int col) {
    if (is_null(s)) return 0;
    if (s->p >= s->end || *s->p != '"') BAIL; /* a number or object read as text: general path */
    if (parse_string(s, &s->cols[col].data, NULL, NULL)) BAIL;
    s->have[col] = 1;
    return 0;
}

static int canonical_int_text(const char *p, size_t n, int64_t *out) {
    Num num;
    St t;
    t.p = p;
    t.end = p + n;
    if (!n || scan_number(&t, &num) || t.p != p + n) return 0;
    return num_int64(&num, out);
}

/* pid, tid, id: the integer, or the string as a label. */
static int field_id(St *s, int icol, int lcol) {
    if (is_null(s)) return 0;
    if (s->p < s->end && *s->p == '"') {
        Buf *d = &s->cols[lcol].data;
        size_t at = d->len;
        if (parse_string(s, d, NULL, NULL)) BAIL;
        int64_t v;
        if (canonical_int_text(d->p + at, d->len - at, &v)) {
            d->len = at;
            s->ival[icol] = v;
            s->have[icol] = 1;
        } else s->have[lcol] = 1;
        return 0;
    }
    Num n;
    if (scan_number(s, &n)) BAIL;
    int64_t v;
    if (!num_int64(&n, &v)) BAIL; /* float, -0 or beyond int64: its text is the label there */
    s->ival[icol] = v;
    s->have[icol] = 1;
    return 0;
}

/* us -> ns as the general path's us_to_ns of the DOUBLE reading. */
static int us_to_ns(double d, int64_t *out) {
    if (!(fabs(d) < 9.2e15)) return 0;
    *out = d == trunc(d) ? (int64_t)d * 1000 : (int64_t)round(d * 1000.0);
    return 1;
}

/* What the exact readings of the general path make of a row's ts (ts_exact_ok):
 * NONE no number; OTHER a number neither exact reading is reproduced for here; BOTH exact for both
 * (the decimal of the shortest double text, _exact_ts_sql, and of the ts text, _exact_ts: the same for
 * up to 3 decimals below 1e15 us); TEXT exact for the ts text only; TEXT_NULL beyond int64 there. */
enum { TS_NONE, TS_OTHER, TS_BOTH, TS_TEXT, TS_TEXT_NULL };

static int field_time(St *s, int col, int is_ts) {
    if (is_null(s)) {
        if (is_ts) { int64_t z = 0; if (buf_put(&s->ts_exact, (char *)&z, 8) || buf_putc(&s->ts_exact_ok, TS_NONE)) BAIL; }
        return 0;
    }
    Num n;
    if (scan_number(s, &n)) BAIL; /* a ts as text: DuckDB casts it, leave that to the general path */
    double d = num_double(&n);
    if (!isfinite(d)) BAIL;
    int64_t v;
    if (us_to_ns(d, &v)) {
        s->ival[col] = v;
        s->have[col] = 1;
    }
    if (is_ts) {
        note_ts_text(s, &n);
        /* round(DECIMAL(38,6) of the text * 1000): exact in 1e-6 us below 1e18 us, rounded half away
         * from zero (a tie past 3 decimals is left to the general path) */
        int64_t exact = 0;
        char kind = TS_OTHER;
        if (!n.has_exp && n.int_digits <= 18 && n.frac_digits <= 6) {
            __int128 u = 0;
            for (size_t i = 0; i < n.int_digits; i++) u = u * 10 + (n.int_start[i] - '0');
            for (size_t i = 0; i < 6; i++) u = u * 10 + (i < n.frac_digits ? n.frac_start[i] - '0' : 0);
            __int128 q = u / 1000, r = u % 1000;
            if (!(r == 500 && n.frac_digits > 3)) {
                if (r >= 500) q++;
                if (q > (__int128)INT64_MAX) kind = TS_TEXT_NULL;
                else {
                    exact = n.neg ? -(int64_t)q : (int64_t)q;
                    kind = n.frac_digits <= 3 && n.int_digits <= 15 ? TS_BOTH : TS_TEXT;
                }
            }
        }
        if (buf_put(&s->ts_exact, (char *)&exact, 8) || buf_putc(&s->ts_exact_ok, kind)) BAIL;
    }
    return 0;
}

/* A common arg json_transform must convert: "key":value (value as written at json[at:]) into defer. */
static int defer(St *s, const char *k, size_t klen, const Buf *json, size_t at) {
    if (s->defer.len && buf_putc(&s->defer, ',')) BAIL;
    if (buf_putc(&s->defer, '"') || buf_put(&s->defer, k, klen) || buf_put(&s->defer, "\":", 2)) BAIL;
    return buf_put(&s->defer, json->p + at, json->len - at);
}

/* args: written back into args_json; the common keys' values noted for the event's end. */
static int field_args(St *s) {
    if (is_null(s)) return 0;
    if (s->p >= s->end || *s->p != '{') BAIL; /* args that are not an object: general path */
    Buf *json = &s->cols[C_ARGS_JSON].data;
    s->p++;
    if (buf_putc(json, '{')) BAIL;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        if (buf_putc(json, '}')) BAIL;
        s->have[C_ARGS_JSON] = 1;
        return 0;
    }
    for (int first = 1;; first = 0) {
        if (!first && buf_putc(json, ',')) BAIL;
        ws(s);
        if (s->p >= s->end || *s->p != '"') BAIL;
        const char *k = s->p + 1;
        int esc = 0;
        if (parse_string(s, NULL, json, &esc)) BAIL;
        if (esc) BAIL; /* as in parse_container */
        size_t klen = s->p - k - 1;
        int common = -1;
        for (int i = 0; i < N_COMMON_INT + N_COMMON_STR; i++)
            if (klen == COMMON_LEN[i] && k[0] == COMMON_KEYS[i][0] && memcmp(k, COMMON_KEYS[i], klen) == 0) {
                common = i;
                break;
            }
        ws(s);
        if (s->p >= s->end || *s->p != ':') BAIL;
        s->p++;
        if (buf_putc(json, ':')) BAIL;
        ws(s);
        if (common >= 0) {
            if (s->common_have[common]) BAIL; /* repeated: which one json_transform takes is its business */
            if (is_null(s)) {
                if (buf_put(json, "null", 4)) BAIL;
                s->common_have[common] = 2; /* seen, NULL */
            } else if (common < N_COMMON_INT && s->p < s->end && (*s->p == '-' || (*s->p >= '0' && *s->p <= '9'))) {
                Num n;
                size_t at = json->len;
                if (scan_number(s, &n) || put_number(json, &n)) BAIL;
                if (num_int64(&n, &s->common_int[common])) s->common_have[common] = 1;
                else if (defer(s, k, klen, json, at)) BAIL; /* a float, or beyond int64 */
                else s->common_have[common] = 2;
            } else if (common >= N_COMMON_INT && s->p < s->end && (*s->p == '[' || *s->p == '{')) {
                size_t at = json->len;
                if (parse_container(s, json, 1)) BAIL;
                s->common_start[common - N_COMMON_INT] = at;
                s->common_len[common - N_COMMON_INT] = json->len - at;
                s->common_have[common] = 1;
            } else {
                /* a string, boolean ... where the column wants an integer or JSON text: json_transform's
                 * cast rules apply, so the value goes to the _deferred column for json_transform */
                size_t at = json->len;
                if (parse_value(s, json, 1) || defer(s, k, klen, json, at)) BAIL;
                s->common_have[common] = 2;
            }
        } else if (klen == 2 && k[0] == 't' && k[1] == 's' && s->p < s->end &&
                   (*s->p == '-' || (*s->p >= '0' && *s->p <= '9'))) {
            Num n;
            if (scan_number(s, &n)) BAIL;
            note_ts_text(s, &n);
            if (put_number(json, &n)) BAIL;
        } else if (parse_value(s, json, 1)) BAIL;
        ws(s);
        if (s->p >= s->end) BAIL;
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == '}') { s->p++; break; }
        BAIL;
    }
    if (buf_putc(json, '}')) BAIL;
    s->have[C_ARGS_JSON] = 1;
    return 0;
}

static int end_row(St *s, size_t ph_at, size_t name_at) {
    /* the common args exist on events other than metadata (ph M; no ph: none either) and [memory] */
    Col *ph = &s->cols[C_PH], *name = &s->cols[C_NAME];
    int ph_ok = s->have[C_PH] && !(ph->data.len - ph_at == 1 && ph->data.p[ph_at] == 'M');
    int mem = s->have[C_NAME] && name->data.len - name_at == 8 && memcmp(name->data.p + name_at, "[memory]", 8) == 0;
    int common = ph_ok && !mem && s->have[C_ARGS_JSON];
    for (int i = 0; i < N_COMMON_INT; i++) {
        int c = C_EXTERNAL_ID + i;
        if (common && s->common_have[i] == 1) { s->ival[c] = s->common_int[i]; s->have[c] = 1; }
    }
    for (int i = 0; i < N_COMMON_STR; i++) {
        int c = C_INPUT_DIMS + i;
        if (common && s->common_have[N_COMMON_INT + i] == 1) {
            Buf *a = &s->cols[C_ARGS_JSON].data;
            if (buf_put(&s->cols[c].data, a->p + s->common_start[i], s->common_len[i])) BAIL;
            s->have[c] = 1;
        }
    }
    if (common && s->defer.len) {
        Buf *d = &s->cols[C_DEFERRED].data;
        if (buf_putc(d, '{') || buf_put(d, s->defer.p, s->defer.len) || buf_putc(d, '}')) BAIL;
        s->have[C_DEFERRED] = 1;
        s->deferred++;
    }
    for (int c = 0; c < N_COLS; c++) {
        Col *col = &s->cols[c];
        if (buf_putc(&col->valid, s->have[c])) BAIL;
        if (IS_STR[c]) {
            if (col->data.len > INT32_MAX) BAIL;
            int32_t o = (int32_t)col->data.len;
            if (buf_put(&col->offs, (char *)&o, 4)) BAIL;
        } else {
            int64_t v = s->have[c] ? s->ival[c] : 0;
            if (buf_put(&col->data, (char *)&v, 8)) BAIL;
        }
    }
    s->rows++;
    return 0;
}

static int parse_event(St *s) {
    if (s->p >= s->end || *s->p != '{') BAIL;
    s->p++;
    memset(s->have, 0, sizeof s->have);
    memset(s->common_have, 0, sizeof s->common_have);
    s->defer.len = 0;
    size_t ph_at = s->cols[C_PH].data.len, name_at = s->cols[C_NAME].data.len;
    int seen_ts = 0;
    unsigned seen = 0;
    ws(s);
    if (s->p < s->end && *s->p == '}') s->p++;
    else for (;;) {
        ws(s);
        if (s->p >= s->end || *s->p != '"') BAIL;
        const char *k = s->p + 1;
        int esc = 0;
        if (parse_string(s, NULL, NULL, &esc)) BAIL;
        if (esc) BAIL; /* an escaped key could still name a column */
        size_t n = s->p - k - 1;
        ws(s);
        if (s->p >= s->end || *s->p != ':') BAIL;
        s->p++;
        ws(s);
        int key = -1, r;
        switch (n) {
            case 1: if (k[0] == 's') key = 0; break;
            case 2:
                if (k[0] == 'p' && k[1] == 'h') key = 1;
                else if (k[0] == 't' && k[1] == 's') key = 2;
                else if (k[0] == 'b' && k[1] == 'p') key = 3;
                else if (k[0] == 'i' && k[1] == 'd') key = 4;
                break;
            case 3:
                if (!memcmp(k, "cat", 3)) key = 5;
                else if (!memcmp(k, "pid", 3)) key = 6;
                else if (!memcmp(k, "tid", 3)) key = 7;
                else if (!memcmp(k, "dur", 3)) key = 8;
                break;
            case 4:
                if (!memcmp(k, "name", 4)) key = 9;
                else if (!memcmp(k, "args", 4)) key = 10;
                break;
        }
        if (key >= 0) {
            if (seen & (1u << key)) BAIL; /* a repeated key: DuckDB refuses the event */
            seen |= 1u << key;
        }
        switch (key) {
            case 0: r = field_string(s, C_SCOPE); break;
            case 1: r = field_string(s, C_PH); break;
            case 2: r = field_time(s, C_TS, 1); seen_ts = 1; break;
            case 3: r = field_string(s, C_BP); break;
            case 4: r = field_id(s, C_FLOW_ID, C_FLOW_LABEL); break;
            case 5: r = field_string(s, C_CAT); break;
            case 6: r = field_id(s, C_PID, C_PID_LABEL); break;
            case 7: r = field_id(s, C_TID, C_TID_LABEL); break;
            case 8: r = field_time(s, C_DUR, 0); break;
            case 9: r = field_string(s, C_NAME); break;
            case 10: r = field_args(s); break;
            default: s->scratch.len = 0; r = parse_value(s, &s->scratch, 0); break;
        }
        if (r) BAIL;
        ws(s);
        if (s->p >= s->end) BAIL;
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == '}') { s->p++; break; }
        BAIL;
    }
    if (!seen_ts) {
        int64_t z = 0;
        if (buf_put(&s->ts_exact, (char *)&z, 8) || buf_putc(&s->ts_exact_ok, TS_NONE)) BAIL;
    }
    return end_row(s, ph_at, name_at);
}

/* A JSON array of events, or with bare set the events alone, comma-separated (the array's inside: the
 * reader hands over a slice of its buffer rather than a bracketed copy). */
static int parse_run(St *s, int bare) {
    ws(s);
    if (!bare) {
        if (s->p >= s->end || *s->p != '[') BAIL;
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == ']') { s->p++; goto done; }
    } else if (s->p >= s->end) goto done;
    for (;;) {
        ws(s);
        if (parse_event(s)) BAIL;
        ws(s);
        if (s->p >= s->end) {
            if (bare) break;
            BAIL;
        }
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == ']' && !bare) { s->p++; break; }
        BAIL;
    }
done:
    ws(s);
    if (s->p != s->end) BAIL;
    if (s->big_fractional_ts) {
        /* the general path reads every ts of this run as an exact decimal: of its text when some ts
         * needs that (ts_text_needed, _exact_ts), else of the shortest text of its double */
        int64_t *ts = (int64_t *)s->cols[C_TS].data.p, *ex = (int64_t *)s->ts_exact.p;
        char *valid = s->cols[C_TS].valid.p;
        for (size_t i = 0; i < s->rows; i++) {
            char k = s->ts_exact_ok.p[i];
            if (k == TS_NONE) continue;
            if (k == TS_OTHER || (!s->ts_text_needed && k != TS_BOTH)) BAIL;
            valid[i] = k != TS_TEXT_NULL;
            ts[i] = valid[i] ? ex[i] : 0;
        }
    }
    /* + base, on the rows that have a ts */
    int64_t *ts = (int64_t *)s->cols[C_TS].data.p;
    for (size_t i = 0; i < s->rows; i++)
        if (s->cols[C_TS].valid.p[i] && __builtin_add_overflow(ts[i], s->base, &ts[i])) BAIL;
    return 0;
}

/* What ingest's checks query (kineto._run_checks) reads from a part, gathered here so that it does not
 * scan the part again: the span (min ts_ns, max ts_ns + coalesce(dur_ns, 0)), the first complete event
 * (ph X) without both times, and whether some args_json may hold collective metadata (the comm_args
 * table's filter, kineto._COMM_ARGS). overflow: the first event whose ts + dur is beyond int64 (-1 for
 * none), which ingest refuses. */
typedef struct {
    int have_ts, comm;
    int64_t first_ts, last_end, bad, overflow; /* bad, overflow: event ids, -1 for none */
} Checks;

static void run_checks(const St *s, Checks *c) {
    const int64_t *ts = (const int64_t *)s->cols[C_TS].data.p, *dur = (const int64_t *)s->cols[C_DUR].data.p;
    const char *tv = s->cols[C_TS].valid.p, *dv = s->cols[C_DUR].valid.p;
    const int32_t *po = (const int32_t *)s->cols[C_PH].offs.p;
    const char *ph = s->cols[C_PH].data.p, *phv = s->cols[C_PH].valid.p;
    c->have_ts = 0; c->bad = -1; c->overflow = -1; c->first_ts = 0; c->last_end = 0;
    for (size_t i = 0; i < s->rows; i++) {
        if (tv[i]) {
            int64_t end = ts[i];
            if (dv[i] && __builtin_add_overflow(ts[i], dur[i], &end)) {
                if (c->overflow < 0) c->overflow = s->first_id + (int64_t)i;
                continue;
            }
            if (!c->have_ts || ts[i] < c->first_ts) c->first_ts = ts[i];
            if (!c->have_ts || end > c->last_end) c->last_end = end;
            c->have_ts = 1;
        }
        if (c->bad < 0 && phv[i] && po[i + 1] - po[i] == 1 && ph[po[i]] == 'X' && !(tv[i] && dv[i]))
            c->bad = s->first_id + (int64_t)i;
    }
    /* over the run's args text at once: a match across two events' args only costs a needless scan */
    const Buf *a = &s->cols[C_ARGS_JSON].data;
    c->comm = a->len && (memmem(a->p, a->len, "\"Collective name\"", 17) || memmem(a->p, a->len, "\"Process Group", 14));
}

static void st_free(St *s) {
    for (int c = 0; c < N_COLS; c++) {
        free(s->cols[c].data.p);
        free(s->cols[c].offs.p);
        free(s->cols[c].valid.p);
    }
    free(s->ts_exact.p);
    free(s->ts_exact_ok.p);
    free(s->scratch.p);
    free(s->defer.p);
}

/* ---- the result: one record batch, handed to DuckDB through the Arrow C stream interface ---------- */

struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children, *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};
struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *);
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};
#define ARROW_FLAG_NULLABLE 2

#define N_OUT (N_COLS + 1) /* event_id, then the columns */
static const char *COLUMN_NAMES[N_OUT] = {
    "event_id", "ph", "cat", "name", "pid", "tid", "pid_label", "tid_label", "ts_ns", "dur_ns", "flow_id",
    "flow_id_label", "bp", "scope", "external_id", "correlation", "device", "stream", "cbid", "ev_idx",
    "record_function_id", "sequence_number", "fwd_thread_id", "input_dims", "input_types", "input_strides",
    "concrete_inputs", "args_json", "_deferred"};

/* The buffers of one decoded run, shared by the Run object and the arrays handed out (refcounted:
 * DuckDB may release an array on any thread, without the GIL). */
typedef struct {
    int refs;
    int64_t rows;
    void *bitmap[N_OUT], *offsets[N_OUT], *data[N_OUT];
    int64_t nulls[N_OUT];
    const void *buffers[N_OUT][3];
    struct ArrowArray child[N_OUT], *children[N_OUT];
} Data;

static void data_unref(Data *d) {
    if (__atomic_sub_fetch(&d->refs, 1, __ATOMIC_ACQ_REL)) return;
    for (int c = 0; c < N_OUT; c++) {
        free(d->bitmap[c]);
        free(d->offsets[c]);
        free(d->data[c]);
    }
    free(d);
}

static int out_is_str(int c) { return c > 0 && IS_STR[c - 1]; }

/* The decoder's buffers -> Data (the buffers move; the one-byte validity becomes a bitmap). */
static Data *data_from(St *s) {
    Data *d = calloc(1, sizeof(Data));
    if (!d) return NULL;
    d->refs = 1;
    d->rows = (int64_t)s->rows;
    size_t nb = (s->rows + 7) / 8 + 1;
    int64_t *ids = malloc(8 * s->rows + 8);
    if (!ids) { free(d); return NULL; }
    for (size_t i = 0; i < s->rows; i++) ids[i] = s->first_id + (int64_t)i;
    d->data[0] = ids;
    for (int c = 1; c < N_OUT; c++) {
        Col *col = &s->cols[c - 1];
        unsigned char *bm = calloc(nb, 1);
        if (!bm) { d->refs = 1; data_unref(d); return NULL; }
        int64_t z = 0;
        for (size_t i = 0; i < s->rows; i++) {
            if (col->valid.p[i]) bm[i >> 3] |= (unsigned char)(1u << (i & 7));
            else z++;
        }
        d->bitmap[c] = bm;
        d->nulls[c] = z;
        d->data[c] = col->data.p ? col->data.p : calloc(1, 8);
        col->data.p = NULL;
        if (out_is_str(c)) {
            d->offsets[c] = col->offs.p;
            col->offs.p = NULL;
        }
        if (!d->data[c]) { data_unref(d); return NULL; }
    }
    for (int c = 0; c < N_OUT; c++) {
        struct ArrowArray *a = &d->child[c];
        int str = out_is_str(c);
        d->buffers[c][0] = d->nulls[c] ? d->bitmap[c] : NULL;
        d->buffers[c][1] = str ? d->offsets[c] : d->data[c];
        d->buffers[c][2] = str ? d->data[c] : NULL;
        a->length = d->rows;
        a->null_count = d->nulls[c];
        a->n_buffers = str ? 3 : 2;
        a->buffers = d->buffers[c];
        d->children[c] = a;
    }
    return d;
}

static void child_release(struct ArrowArray *a) { a->release = NULL; }

static void array_release(struct ArrowArray *a) {
    Data *d = a->private_data;
    for (int c = 0; c < N_OUT; c++) d->child[c].release = NULL;
    a->release = NULL;
    data_unref(d);
}

static void schema_release(struct ArrowSchema *sc) {
    if (sc->children) {
        for (int64_t i = 0; i < sc->n_children; i++) free(sc->children[i]);
        free(sc->children);
    }
    sc->release = NULL;
}

static void child_schema_release(struct ArrowSchema *sc) { sc->release = NULL; }

typedef struct {
    Data *data;
    int done;
} StreamState;

static int stream_schema(struct ArrowArrayStream *st, struct ArrowSchema *out) {
    (void)st;
    memset(out, 0, sizeof *out);
    out->format = "+s";
    out->name = "";
    out->n_children = N_OUT;
    out->children = calloc(N_OUT, sizeof(struct ArrowSchema *));
    if (!out->children) return 12; /* ENOMEM */
    for (int c = 0; c < N_OUT; c++) {
        struct ArrowSchema *ch = calloc(1, sizeof *ch);
        if (!ch) { out->release = schema_release; schema_release(out); return 12; }
        ch->format = out_is_str(c) ? "u" : "l";
        ch->name = COLUMN_NAMES[c];
        ch->flags = ARROW_FLAG_NULLABLE;
        ch->release = child_schema_release;
        out->children[c] = ch;
    }
    out->release = schema_release;
    return 0;
}

static int stream_next(struct ArrowArrayStream *st, struct ArrowArray *out) {
    StreamState *ss = st->private_data;
    memset(out, 0, sizeof *out);
    if (ss->done) return 0; /* out->release NULL: the end of the stream */
    ss->done = 1;
    Data *d = ss->data;
    __atomic_add_fetch(&d->refs, 1, __ATOMIC_ACQ_REL);
    for (int c = 0; c < N_OUT; c++) d->child[c].release = child_release;
    out->length = d->rows;
    out->n_buffers = 1;
    static const void *no_validity[1] = {NULL};
    out->buffers = no_validity;
    out->n_children = N_OUT;
    out->children = d->children;
    out->release = array_release;
    out->private_data = d;
    return 0;
}

static const char *stream_error(struct ArrowArrayStream *st) { (void)st; return NULL; }

static void stream_release(struct ArrowArrayStream *st) {
    StreamState *ss = st->private_data;
    if (ss) {
        data_unref(ss->data);
        free(ss);
    }
    st->release = NULL;
}

static void capsule_free(PyObject *cap) {
    struct ArrowArrayStream *st = PyCapsule_GetPointer(cap, "arrow_array_stream");
    if (st) {
        if (st->release) st->release(st);
        free(st);
    }
}

typedef struct {
    PyObject_HEAD
    Data *data;
    Py_ssize_t deferred;
    Checks checks;
} RunObject;

static void run_dealloc(RunObject *self) {
    if (self->data) data_unref(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *run_stream(RunObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"requested_schema", NULL};
    PyObject *req = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", names, &req)) return NULL;
    struct ArrowArrayStream *st = calloc(1, sizeof *st);
    StreamState *ss = calloc(1, sizeof *ss);
    if (!st || !ss) { free(st); free(ss); return PyErr_NoMemory(); }
    __atomic_add_fetch(&self->data->refs, 1, __ATOMIC_ACQ_REL);
    ss->data = self->data;
    st->get_schema = stream_schema;
    st->get_next = stream_next;
    st->get_last_error = stream_error;
    st->release = stream_release;
    st->private_data = ss;
    PyObject *cap = PyCapsule_New(st, "arrow_array_stream", capsule_free);
    if (!cap) { stream_release(st); free(st); }
    return cap;
}

static PyObject *run_rows(RunObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(self->data->rows);
}

static PyMethodDef RUN_METHODS[] = {
    {"__arrow_c_stream__", (PyCFunction)(void (*)(void))run_stream, METH_VARARGS | METH_KEYWORDS,
     "the run's events as an Arrow C stream of one record batch"},
    {NULL, NULL, 0, NULL}};
static PyObject *run_deferred(RunObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(self->deferred);
}

static PyObject *run_checks_get(RunObject *self, void *closure) {
    (void)closure;
    const Checks *c = &self->checks;
    PyObject *t = Py_BuildValue("(OOOOO)", Py_None, Py_None, Py_None, c->comm ? Py_True : Py_False, Py_None);
    if (!t) return NULL;
    if (c->have_ts) {
        PyObject *a = PyLong_FromLongLong(c->first_ts), *b = PyLong_FromLongLong(c->last_end);
        if (!a || !b) { Py_XDECREF(a); Py_XDECREF(b); Py_DECREF(t); return NULL; }
        Py_SETREF(((PyTupleObject *)t)->ob_item[0], a);
        Py_SETREF(((PyTupleObject *)t)->ob_item[1], b);
    }
    int64_t ids[2] = {c->bad, c->overflow};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        PyObject *b = PyLong_FromLongLong(ids[k]);
        if (!b) { Py_DECREF(t); return NULL; }
        Py_SETREF(((PyTupleObject *)t)->ob_item[k ? 4 : 2], b);
    }
    return t;
}

static PyGetSetDef RUN_GETSET[] = {{"rows", (getter)run_rows, NULL, "events in the run", NULL},
                                   {"checks", (getter)run_checks_get, NULL,
                                    "(first_ts_ns, last_end_ns, first complete event without both times, "
                                    "may hold comm args, first event whose ts + dur is beyond int64): what "
                                    "ingest's checks query gives (kineto._run_checks)", NULL},
                                   {"deferred", (getter)run_deferred, NULL,
                                    "events whose _deferred column holds common args for json_transform", NULL},
                                   {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject RunType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tracekit.ingest._events.Run",
    .tp_basicsize = sizeof(RunObject),
    .tp_dealloc = (destructor)run_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One decoded run of events (read it through __arrow_c_stream__)",
    .tp_methods = RUN_METHODS,
    .tp_getset = RUN_GETSET,
};

/* decode(run: bytes-like, first_id: int, base_ns: int, bare: bool = False) -> Run, or None for the general
 * path. bare: run holds the events without the array's brackets. */
static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    long long base, first_id;
    int bare = 0;
    if (!PyArg_ParseTuple(args, "y*LL|p", &view, &first_id, &base, &bare)) return NULL;
    St *s = calloc(1, sizeof(St));
    if (!s) { PyBuffer_Release(&view); return PyErr_NoMemory(); }
    s->p = view.buf;
    s->end = (const char *)view.buf + view.len;
    s->base = base;
    s->first_id = first_id;
    int r = 0;
    Data *d = NULL;
    Checks checks;
    Py_BEGIN_ALLOW_THREADS
    /* sized from the run: most growth happens once */
    size_t n = (size_t)view.len;
    r = buf_reserve(&s->cols[C_ARGS_JSON].data, n / 2) || buf_reserve(&s->cols[C_NAME].data, n / 8);
    for (int c = 0; c < N_COLS && !r; c++) {
        int32_t z = 0;
        r = buf_reserve(&s->cols[c].valid, n / 128) ||
            (IS_STR[c] ? buf_reserve(&s->cols[c].offs, n / 32) || buf_put(&s->cols[c].offs, (char *)&z, 4)
                       : buf_reserve(&s->cols[c].data, n / 16));
    }
    if (!r) r = parse_run(s, bare);
    if (!r) run_checks(s, &checks);
    if (!r) d = data_from(s);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_ssize_t deferred = (Py_ssize_t)s->deferred;
    st_free(s);
    free(s);
    if (r) Py_RETURN_NONE;
    if (!d) return PyErr_NoMemory();
    RunObject *o = PyObject_New(RunObject, &RunType);
    if (!o) { data_unref(d); return NULL; }
    o->data = d;
    o->deferred = deferred;
    o->checks = checks;
    return (PyObject *)o;
}

static PyMethodDef METHODS[] = {
    {"decode", decode, METH_VARARGS,
     "decode(run, first_id, base_ns, bare=False) -> Run of a JSON array of Kineto events (bare: the events "
     "without the brackets), or None for the general path"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_events", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__events(void) {
    for (int i = 0; i < N_COMMON_INT + N_COMMON_STR; i++) COMMON_LEN[i] = strlen(COMMON_KEYS[i]);
    if (PyType_Ready(&RunType) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (!m) return NULL;
    PyObject *names = PyTuple_New(N_OUT);
    if (!names) return NULL;
    for (int c = 0; c < N_OUT; c++) PyTuple_SET_ITEM(names, c, PyUnicode_FromString(COLUMN_NAMES[c]));
    if (PyModule_AddObject(m, "COLUMNS", names) < 0) return NULL;
    Py_INCREF(&RunType);
    PyModule_AddObject(m, "Run", (PyObject *)&RunType);
    return m;
}
