// The checks of the CPU path, in compute-sanitizer's terms (included by cuda_host.h; kernellab/run/sim/cuda/host.py
// rewrites a cell's source to use them):
// - memcheck: a kernel's pointer parameters become kl::gptr<T>, which knows its argument's bytes: an index or a
//   dereference outside them is an "Invalid __global__ read/write", reported with the cell line of the access
//   (Idx takes `__builtin_LINE()` as a defaulted argument of its converting constructor: the caller's line), the
//   thread and the block, and the launch stops there, as a faulting kernel does. `__shared__` arrays become
//   kl::sarr<T, dims...>: an index outside the array is an "Invalid __shared__ read/write".
// - racecheck: every element of a shared array keeps a shadow of its last write and the reads since, in the current
//   barrier interval; an access by another thread that conflicts with it (one of them a write) is a hazard unless a
//   __syncthreads() lies between them or, for two lanes of one warp, a __syncwarp() both took part in (the rules of
//   kernellab.run.simrace, the Numba simulator's). Shuffles do not order shared memory; atomics are not watched.
// - initcheck (shared memory): a read of an element no thread of the block wrote, where no thread writes it in the
//   same barrier interval either (that is a race).
// - synccheck: a __syncthreads() that threads wait at on different lines, or that some lanes of a warp wait at while
//   others of the warp returned past it.
// KL_CHECKS: 2 all of the above; 1 global bounds only (T& for every element, shared arrays plain); 0 none.
#pragma once
#include <map>
#include <tuple>
#include <type_traits>

namespace kl {

// ---- findings -------------------------------------------------------------------------------------------------
struct FindingEntry {
    std::string tool, kind, message, name, detail, access, other_access;
    int line = 0, other_line = 0;
    dim3 thread, block, other_thread;
    bool has_other = false;
    long long index = -1, extent = 0;
    int size = 0;
    long long count = 0;
    long long seq = 0;            // the order of first occurrence
};

inline std::mutex& findings_lock() { static std::mutex m; return m; }
inline std::map<std::tuple<std::string, int, int, std::string>, FindingEntry>& findings() {
    static std::map<std::tuple<std::string, int, int, std::string>, FindingEntry> f;
    return f;
}
inline void add_finding(FindingEntry e) {
    std::lock_guard<std::mutex> g(findings_lock());
    auto key = std::make_tuple(e.kind, std::min(e.line, e.other_line ? e.other_line : e.line),
                               std::max(e.line, e.other_line), e.kind == "race" ? std::string() : e.message);
    auto& f = findings();
    auto it = f.find(key);
    if (it == f.end()) {
        static long long next = 0;
        e.count = 1;
        e.seq = ++next;
        f.emplace(key, std::move(e));
    } else {
        it->second.count += 1;
    }
}

inline dim3 tid_of(int linear) {
    dim3 d = g_block->bdim;
    return dim3{unsigned(linear % d.x), unsigned((linear / d.x) % d.y), unsigned(linear / (d.x * d.y))};
}

struct OutOfBounds : std::runtime_error { using std::runtime_error::runtime_error; };

// An index, with the line of the expression that indexes (the caller's line: __builtin_LINE() in a default argument).
struct Idx {
    long long v;
    int line;
    template <typename I, typename = std::enable_if_t<std::is_convertible<I, long long>::value>>
    Idx(I v_, int line_ = __builtin_LINE()) : v(static_cast<long long>(v_)), line(line_) {}
};

inline void out_of_bounds(const char* space, const char* name, bool write, const char* access,
                                       long long index, long long extent, int size, int line) {
    FindingEntry e;
    e.tool = "memcheck";
    e.kind = write ? "invalid_write" : (std::strcmp(access, "read") == 0 ? "invalid_read" : "invalid_access");
    e.message = std::string("Invalid __") + space + "__ " + access + " of size " + std::to_string(size) + " bytes";
    e.name = name;
    e.index = index;
    e.extent = extent;
    e.size = size;
    e.line = line;
    e.thread = self().tid;
    e.block = g_block->bid;
    e.detail = std::string(name) + "[" + std::to_string(index) + "]: " +
               (index < 0 ? std::to_string(-index) + " element" + (index == -1 ? "" : "s") + " before its start"
                          : std::to_string(index - extent + 1) + " element" + (index - extent == 0 ? "" : "s") +
                                " past its end") +
               " (" + name + " has " + std::to_string(extent) + " elements)";
    add_finding(e);
    g_block->out_of_bounds = true;
}

// Where an out-of-bounds access goes instead (reads see zeros): the launch goes on, as on a GPU, and stops being
// checked only where the kernel's own results are compared.
template <typename T> inline T& scratch() {
    alignas(64) static thread_local unsigned char cell[sizeof(T) < 256 ? 256 : sizeof(T)];
    std::memset(cell, 0, sizeof(cell));
    return *reinterpret_cast<T*>(cell);
}

// ---- global memory --------------------------------------------------------------------------------------------
template <typename T> struct gptr;

// An element of global memory: reads and writes told apart (arithmetic types at KL_CHECKS 2).
template <typename T> struct gref {
    using value_type = T;
    T* p;
    const char* lo;               // the argument's bytes (a copy: `auto v = x[i]` may outlive the pointer)
    size_t bytes;
    const char* name;
    int line;
    bool check(bool write) const;
    T& cell(bool write) const { return check(write) ? *p : scratch<T>(); }
    operator T() const { return cell(false); }
    gref& operator=(const T& v) { cell(true) = v; return *this; }
    gref& operator=(const gref& o) { T v = T(o); cell(true) = v; return *this; }
#define KL_GREF_OP(op) \
    template <typename V> gref& operator op##=(const V& v) { if (check(false)) cell(true) op##= v; return *this; }
    KL_GREF_OP(+) KL_GREF_OP(-) KL_GREF_OP(*) KL_GREF_OP(/) KL_GREF_OP(%) KL_GREF_OP(&) KL_GREF_OP(|) KL_GREF_OP(^)
    KL_GREF_OP(<<) KL_GREF_OP(>>)
#undef KL_GREF_OP
    gref& operator++() { if (check(false)) ++*p; return *this; }
    gref& operator--() { if (check(false)) --*p; return *this; }
    T operator++(int) { return check(false) ? (*p)++ : T{}; }
    T operator--(int) { return check(false) ? (*p)-- : T{}; }
    T* operator&() const { return p; }
};

template <typename T> struct gptr {
    T* p = nullptr;
    const char* lo = nullptr;     // the argument's first byte
    size_t bytes = 0;             // its size
    const char* name = "?";
    int line = 0;                 // the line of the arithmetic that made this pointer

    gptr() = default;
    gptr(T* p_, size_t bytes_, const char* name_) : p(p_), lo(reinterpret_cast<const char*>(p_)), bytes(bytes_),
                                                    name(name_) {}
    gptr(std::nullptr_t) {}
    template <typename U, typename = std::enable_if_t<std::is_convertible<T*, U>::value>>
    operator U() const { return p; }                    // raw pointer (unchecked from there on), bool

    long long element(const T* q) const {              // index of q in the argument, in elements of T
        return (reinterpret_cast<const char*>(q) - lo) / (long long)(sizeof(T) ? sizeof(T) : 1);
    }
    bool check(const T* q, int at, bool write, const char* access) const {   // false: out of bounds (reported)
        // a null pointer argument has no element: every access through it is out of bounds (reported, never a
        // fault of the host process, which is the notebook's kernel)
        const char* c = reinterpret_cast<const char*>(q);
        if (c < lo || c + sizeof(T) > lo + bytes) {
            out_of_bounds("global", name, write, access, element(q),
                          (long long)(bytes / (sizeof(T) ? sizeof(T) : 1)), int(sizeof(T)), at);
            return false;
        }
        return true;
    }
#if KL_CHECKS >= 2
    using ref = std::conditional_t<std::is_arithmetic<T>::value && !std::is_const<T>::value, gref<T>, T&>;
    ref operator[](Idx i) const {
        if constexpr (std::is_same<ref, T&>::value) {
            return check(p + i.v, i.line, false, std::is_const<T>::value ? "read" : "access") ? p[i.v]
                                                                                                : scratch<T>();
        } else {
            return gref<T>{p + i.v, lo, bytes, name, i.line};
        }
    }
    ref operator*() const { return (*this)[Idx(0, line)]; }
#else
    T& operator[](Idx i) const {
        return check(p + i.v, i.line, false, std::is_const<T>::value ? "read" : "access") ? p[i.v] : scratch<T>();
    }
    T& operator*() const {
        return check(p, line, false, std::is_const<T>::value ? "read" : "access") ? *p : scratch<T>();
    }
#endif
    T* operator->() const { return check(p, line, false, "access") ? p : &scratch<T>(); }
    gptr with(T* q, int at) const { gptr r = *this; r.p = q; r.line = at; return r; }
    gptr operator+(Idx i) const { return with(p + i.v, i.line); }
    gptr operator-(Idx i) const { return with(p - i.v, i.line); }
    friend gptr operator+(Idx i, const gptr& g) { return g.with(g.p + i.v, i.line); }
    std::ptrdiff_t operator-(const gptr& o) const { return p - o.p; }
    std::ptrdiff_t operator-(const T* o) const { return p - o; }
    gptr& operator+=(Idx i) { p += i.v; line = i.line; return *this; }
    gptr& operator-=(Idx i) { p -= i.v; line = i.line; return *this; }
    gptr& operator++() { ++p; return *this; }
    gptr& operator--() { --p; return *this; }
    gptr operator++(int) { gptr r = *this; ++p; return r; }
    gptr operator--(int) { gptr r = *this; --p; return r; }
    bool operator==(std::nullptr_t) const { return p == nullptr; }
    bool operator!=(std::nullptr_t) const { return p != nullptr; }
    bool operator==(const gptr& o) const { return p == o.p; }
    bool operator!=(const gptr& o) const { return p != o.p; }
    bool operator<(const gptr& o) const { return p < o.p; }
};

template <typename T> struct is_gptr : std::false_type {};
template <typename T> struct is_gptr<gptr<T>> : std::true_type {};

template <typename T> inline bool gref<T>::check(bool write) const {
    gptr<T> g;
    g.lo = lo;
    g.bytes = bytes;
    g.name = name;
    return g.check(p, line, write, write ? "write" : "read");
}

// atomics on a checked pointer: the element checked (as a read and a write), then the host's atomic
#define KL_GPTR_ATOMIC(fn)                                                                                   \
    template <typename T, typename... V> inline auto fn(const gptr<T>& p, V... v) {                        \
        if (!p.check(p.p, p.line, true, "atomic")) return T{};                                             \
        return ::fn(p.p, static_cast<T>(v)...);                                                            \
    }
KL_GPTR_ATOMIC(atomicAdd) KL_GPTR_ATOMIC(atomicSub) KL_GPTR_ATOMIC(atomicExch) KL_GPTR_ATOMIC(atomicMax)
KL_GPTR_ATOMIC(atomicMin) KL_GPTR_ATOMIC(atomicCAS) KL_GPTR_ATOMIC(atomicInc) KL_GPTR_ATOMIC(atomicAnd)
KL_GPTR_ATOMIC(atomicOr) KL_GPTR_ATOMIC(atomicXor)
#undef KL_GPTR_ATOMIC
// the cache-hinted loads and stores on a checked pointer
template <typename T> inline std::remove_const_t<T> __ldg(const gptr<T>& p) { return p[Idx(0, p.line)]; }
template <typename T> inline std::remove_const_t<T> __ldcg(const gptr<T>& p) { return p[Idx(0, p.line)]; }
template <typename T> inline std::remove_const_t<T> __ldcs(const gptr<T>& p) { return p[Idx(0, p.line)]; }
template <typename T> inline std::remove_const_t<T> __ldlu(const gptr<T>& p) { return p[Idx(0, p.line)]; }
template <typename T, typename V> inline void __stcs(const gptr<T>& p, V v) { p[Idx(0, p.line)] = v; }
template <typename T, typename V> inline void __stcg(const gptr<T>& p, V v) { p[Idx(0, p.line)] = v; }

// reinterpret_cast<U*>(p) on a checked pointer: the same argument's bytes, seen as U.
template <typename To, typename From> inline auto reinterpret(From&& v) {
    using F = std::decay_t<From>;
    if constexpr (std::is_pointer<To>::value && is_gptr<F>::value) {
        using U = std::remove_pointer_t<To>;
        gptr<U> r;
        r.p = reinterpret_cast<U*>(v.p);
        r.lo = v.lo;
        r.bytes = v.bytes;
        r.name = v.name;
        r.line = v.line;
        return r;
    } else if constexpr (is_gptr<F>::value) {
        return reinterpret_cast<To>(v.p);
    } else if constexpr (std::is_class<F>::value && std::is_pointer<To>::value) {   // a shared array
        return reinterpret_cast<To>(&v);
    } else {
        return reinterpret_cast<To>(v);
    }
}

// ---- shared memory ----------------------------------------------------------------------------------------------
struct ReadMark { int tid, line, wgen; };
struct Shadow {
    unsigned owner = 0;          // the block (kl::Block::serial) whose accesses these are
    bool written = false;        // some thread of the block wrote it
    int epoch = -1;              // the barrier interval of the marks below
    int w_tid = -1, w_line = 0, w_wgen = 0;   // the last write in that interval (w_tid -1: none)
    std::vector<ReadMark> reads;              // the reads since it, in that interval
    int pending = -1;            // an uninitialised read waiting for the interval's end (index into Block's list)
    unsigned pending_flush = 0;
};


inline bool warp_ordered(int a_tid, int a_wgen, int b_tid, int b_wgen) {
    return a_tid / 32 == b_tid / 32 && a_wgen != b_wgen;
}

inline void race(const char* hazard, int first_tid, int first_line, const char* first, int tid, int line,
                 const char* second, const char* name, long long index, int size) {
    FindingEntry e;
    e.tool = "racecheck";
    e.kind = "race";
    e.message = std::string("shared-memory data race (") + hazard + " hazard)";
    e.line = first_line;
    e.other_line = line;
    e.access = first;
    e.other_access = second;
    e.thread = tid_of(first_tid);
    e.other_thread = tid_of(tid);
    e.has_other = true;
    e.block = g_block->bid;
    e.name = name;
    e.index = index;
    e.size = size;
    bool same_warp = first_tid / 32 == tid / 32;
    e.detail = std::string(name) + "[" + std::to_string(index) + "]; " +
               (same_warp ? "threads of one warp, and no __syncwarp() or __syncthreads() orders these accesses"
                          : "no __syncthreads() orders these accesses") +
               (first_line == 0 || line == 0 ? " (line 0: an ldmatrix read or a cp.async write, inside a kernellab "
                                               "header)" : "");
    add_finding(e);
}

void note_access(Shadow& s, bool write, int line, const char* name, long long index, int size);

template <typename T> struct sref {
    using value_type = T;
    T* p;
    Shadow* s;
    const char* name;
    long long index;
    int line;
    operator T() const { note_access(*s, false, line, name, index, int(sizeof(T))); return *p; }
    sref& operator=(const T& v) { note_access(*s, true, line, name, index, int(sizeof(T))); *p = v; return *this; }
    sref& operator=(const sref& o) { T v = T(o); note_access(*s, true, line, name, index, int(sizeof(T))); *p = v;
                                     return *this; }
#define KL_SREF_OP(op)                                                                                 \
    template <typename V> sref& operator op##=(const V& v) {                                           \
        note_access(*s, false, line, name, index, int(sizeof(T)));                                     \
        note_access(*s, true, line, name, index, int(sizeof(T)));                                      \
        *p op##= v; return *this; }
    KL_SREF_OP(+) KL_SREF_OP(-) KL_SREF_OP(*) KL_SREF_OP(/) KL_SREF_OP(%) KL_SREF_OP(&) KL_SREF_OP(|) KL_SREF_OP(^)
    KL_SREF_OP(<<) KL_SREF_OP(>>)
#undef KL_SREF_OP
    sref& operator++() { *this += 1; return *this; }
    sref& operator--() { *this -= 1; return *this; }
    T operator++(int) { T o = T(*this); *this += 1; return o; }
    T operator--(int) { T o = T(*this); *this -= 1; return o; }
    T* operator&() const { return p; }
};

template <typename T, long long... D> struct sdims;
template <typename T> struct sdims<T> { static constexpr long long size = 1; };
template <typename T, long long D0, long long... D> struct sdims<T, D0, D...> {
    static constexpr long long size = D0 * sdims<T, D...>::size;
};

template <typename T, bool Dynamic, long long... D> struct sarr;

// The shared arrays this OS thread (its blocks) has, by address: what the warp-level PTX (ldmatrix, cp.async) reads
// and writes through a shared address is checked against them as a C++ access of the same elements is.
struct SharedRange {
    const char* lo;
    size_t bytes, elem;
    void* arr;
    Shadow* (*shadow)(void*, long long);
    long long (*extent)(void*);
    const char* name;
};
inline std::vector<SharedRange>& shared_ranges() { static thread_local std::vector<SharedRange> r; return r; }

// a row of a multi-dimensional shared array: the element offset so far and the dimensions not yet indexed
template <typename A, long long... Rest> struct srow;
template <typename A, long long R0, long long... Rest> struct srow<A, R0, Rest...> {
    A* a;
    long long base;
    auto operator[](Idx i) const {
        long long flat = base * R0 + i.v;
        if constexpr (sizeof...(Rest) == 0) return a->at(flat, i.line);
        else return srow<A, Rest...>{a, flat};
    }
};
template <typename A, long long D0, long long... Rest> struct first_index {
    static auto at(A* a, Idx i) {
        if constexpr (sizeof...(Rest) == 0) return a->at(i.v, i.line);
        else return srow<A, Rest...>{a, i.v};
    }
};

template <typename T, bool Dynamic, long long... D> struct sarr {
    static_assert(sizeof...(D) >= 1, "a shared array has a size");
    static constexpr long long N = sdims<T, D...>::size;
    alignas(16) T data[N];
    std::vector<Shadow> shadow;
    const char* name = "shared";
    sarr(const char* n) : name(n) {
        shared_ranges().push_back({reinterpret_cast<const char*>(data), sizeof(data), sizeof(T), this,
                                   &sarr::shadow_of, &sarr::extent_of, name});
    }
    static Shadow* shadow_of(void* self, long long i) {
        auto* a = static_cast<sarr*>(self);
        if (a->shadow.size() != size_t(N)) a->shadow.resize(N);
        return &a->shadow[i];
    }
    static long long extent_of(void* self) { return static_cast<sarr*>(self)->extent(); }

    long long extent() const {
        if (Dynamic) return std::min<long long>(N, (long long)(g_block->dyn_bytes / sizeof(T)));
        return N;
    }
    sref<T> at(long long flat, int line) {
        if (shadow.size() != size_t(N)) shadow.resize(N);
        if (flat < 0 || flat >= extent()) {
            out_of_bounds("shared", name, false, "access", flat, extent(), int(sizeof(T)), line);
            static thread_local Shadow spare;
            spare = Shadow{};
            spare.written = true;
            return sref<T>{&scratch<T>(), &spare, name, flat, line};
        }
        return sref<T>{&data[flat], &shadow[flat], name, flat, line};
    }
    auto operator[](Idx i) { return first_index<sarr, D...>::at(this, i); }
    // the array as a pointer (to a device function, a cast, cvta): unchecked from there on
    template <typename U, typename = std::enable_if_t<std::is_convertible<T*, U>::value>>
    operator U() { return data; }
    T* operator&() { return data; }
    // `smem + offset` (a carved-up dynamic array): a plain pointer, unchecked from there on (shared addresses made
    // from it are checked again where ldmatrix and cp.async use them)
    template <typename I, typename = std::enable_if_t<std::is_integral<I>::value>>
    T* operator+(I i) { return data + i; }
};


// ---- the shadow of a shared element: races and uninitialised reads ----------------------------------------------
inline void note_access(Shadow& s, bool write, int line, const char* name, long long index, int size) {
    Block& b = *g_block;
    int tid = self().linear;
    int wgen = b.warp_gen[tid / 32];
    if (s.owner != b.serial) {               // a new block: its own history (the bytes stay, as on a GPU)
        s = Shadow{};
        s.owner = b.serial;
    }
    if (s.epoch != b.epoch) {                // a barrier since: everything before it is ordered
        s.epoch = b.epoch;
        s.w_tid = -1;
        s.reads.clear();
    }
    bool pending_live = s.pending >= 0 && s.pending_flush == b.flush;
    if (!write) {
        if (s.w_tid >= 0 && s.w_tid != tid && !warp_ordered(s.w_tid, s.w_wgen, tid, wgen))
            race("RAW", s.w_tid, s.w_line, "Write", tid, line, "Read", name, index, size);
        if (!s.written && !pending_live) {
            s.pending = int(b.pending.size());
            s.pending_flush = b.flush;
            b.pending.push_back(PendingRead{line, tid, index, name, size, false});
        }
        if (s.reads.empty() || s.reads.back().tid != tid || s.reads.back().line != line)
            s.reads.push_back(ReadMark{tid, line, wgen});
        return;
    }
    if (s.w_tid >= 0 && s.w_tid != tid && !warp_ordered(s.w_tid, s.w_wgen, tid, wgen))
        race("WAW", s.w_tid, s.w_line, "Write", tid, line, "Write", name, index, size);
    for (const ReadMark& r : s.reads)
        if (r.tid != tid && !warp_ordered(r.tid, r.wgen, tid, wgen)) {
            race("WAR", r.tid, r.line, "Read", tid, line, "Write", name, index, size);
            break;
        }
    if (pending_live) b.pending[s.pending].cancelled = true;   // a write unordered with the read: a race, not this
    s.pending = -1;
    s.reads.clear();
    s.w_tid = tid;
    s.w_line = line;
    s.w_wgen = wgen;
    s.written = true;
}

// `bytes` at p, read or written by this thread through a shared address (`what`: the instruction): each element of
// a shared array they touch is noted as an access (racecheck, initcheck), an element past a dynamic array's launch
// size is out of bounds (memcheck). The line is 0 (the instruction runs inside a kernellab header's wrapper); the
// findings' details name the instruction.
inline void note_shared(const void* p, size_t bytes, bool write, const char* what) {
    const char* c = static_cast<const char*>(p);
    for (const SharedRange& r : shared_ranges()) {
        if (c < r.lo || c >= r.lo + r.bytes) continue;
        long long first = (c - r.lo) / (long long)r.elem;
        long long last = (c + bytes - 1 - r.lo) / (long long)r.elem;
        long long extent = r.extent(r.arr);
        for (long long i = first; i <= last && i * (long long)r.elem < (long long)r.bytes; ++i) {
            if (i >= extent) {
                out_of_bounds("shared", r.name, write, write ? "write" : "read", i, extent, int(r.elem), 0);
                return;
            }
            note_access(*r.shadow(r.arr, i), write, 0, r.name, i, int(r.elem));
        }
        return;
    }
}

inline void flush_pending(Block& b) {
    for (const PendingRead& r : b.pending) {
        if (r.cancelled) continue;
        FindingEntry e;
        e.tool = "initcheck";
        e.kind = "uninitialized_read";
        e.message = "Uninitialized __shared__ memory read of size " + std::to_string(r.size) + " bytes";
        e.line = r.line;
        e.thread = tid_of(r.tid);
        e.block = b.bid;
        e.access = "Read";
        e.name = r.name;
        e.index = r.index;
        e.size = r.size;
        e.detail = std::string(r.name) + "[" + std::to_string(r.index) +
                   "]: no thread of the block wrote it before this read (shared memory is not zeroed at launch)";
        add_finding(e);
    }
    b.pending.clear();
    b.flush++;
}

// ---- barriers: synccheck -----------------------------------------------------------------------------------
inline void block_barrier_released(Block& b) {
    int n = int(b.fibers.size());
    std::vector<int> lines;
    for (auto& f : b.fibers)
        if (f.wait == Wait::block && std::find(lines.begin(), lines.end(), f.barrier_line) == lines.end())
            lines.push_back(f.barrier_line);
    std::sort(lines.begin(), lines.end());
    bool warp_level = false;
    for (int w0 = 0; w0 < n; w0 += 32) {
        int waiting = 0, away = 0, first = -1, away_first = -1, line = 0;
        for (int i = w0; i < std::min(n, w0 + 32); ++i) {
            const Fiber& f = b.fibers[i];
            if (f.wait == Wait::block) { if (!waiting++) { first = i; line = f.barrier_line; } }
        }
        if (!waiting) continue;
        for (int i = w0; i < std::min(n, w0 + 32); ++i) {
            const Fiber& f = b.fibers[i];
            // a lane that returned past this barrier (or ran off the kernel's end) without reaching it
            if (f.wait == Wait::done && (f.exit_line == 0 || f.exit_line > line)) { if (!away++) away_first = i; }
        }
        if (!away) continue;
        warp_level = true;
        FindingEntry e;
        e.tool = "synccheck";
        e.kind = "barrier";
        e.message = "Barrier error detected. Divergent thread(s) in warp";
        e.line = line;
        e.thread = b.fibers[first].tid;
        e.block = b.bid;
        int exit_line = b.fibers[away_first].exit_line;
        e.detail = std::to_string(waiting) + " thread(s) of warp " + std::to_string(w0 / 32) +
                   " wait at this __syncthreads(); " + std::to_string(away) + " returned " +
                   (exit_line ? "at line " + std::to_string(exit_line) : std::string("at the kernel's end")) +
                   " without reaching it (every thread of the block must reach each __syncthreads(), or none)";
        add_finding(e);
    }
    if (!warp_level && lines.size() > 1) {
        FindingEntry e;
        e.tool = "synccheck";
        e.kind = "barrier";
        e.message = "Barrier error detected. Divergent thread(s) in block";
        e.line = lines[0];
        e.other_line = lines[1];
        for (auto& f : b.fibers) if (f.wait == Wait::block) { e.thread = f.tid; break; }
        e.block = b.bid;
        e.detail = "threads of the block wait at the __syncthreads() of lines " + std::to_string(lines[0]) + " and " +
                   std::to_string(lines[1]) + " at once";
        add_finding(e);
    }
    flush_pending(b);
    b.epoch++;
}

// ---- what the Python side reads ----------------------------------------------------------------------------------
inline std::string findings_text() {
    std::lock_guard<std::mutex> g(findings_lock());
    std::string out;
    auto d = [](dim3 v) { return std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z); };
    for (auto& [key, e] : findings()) {
        out += e.tool + "\t" + e.kind + "\t" + e.message + "\t" + std::to_string(e.line) + "\t" +
               std::to_string(e.other_line) + "\t" + d(e.thread) + "\t" + d(e.block) + "\t" +
               (e.has_other ? d(e.other_thread) : std::string("")) + "\t" + e.access + "\t" + e.other_access + "\t" +
               e.name + "\t" + std::to_string(e.index) + "\t" + std::to_string(e.size) + "\t" +
               std::to_string(e.count) + "\t" + e.detail + "\t" + std::to_string(e.seq) + "\n";
    }
    return out;
}
inline void clear_findings() {
    std::lock_guard<std::mutex> g(findings_lock());
    findings().clear();
}


// `auto v = x[i];` (host.py wraps the initialiser): the value, not the checked element
template <typename T> struct is_proxy : std::false_type {};
template <typename T> struct is_proxy<gref<T>> : std::true_type {};
template <typename T> struct is_proxy<sref<T>> : std::true_type {};
template <typename P, typename = std::enable_if_t<is_proxy<std::decay_t<P>>::value>>
inline auto value(P&& r) { return typename std::decay_t<P>::value_type(r); }
template <typename T, typename = std::enable_if_t<!is_proxy<std::decay_t<T>>::value>, typename = void>
inline decltype(auto) value(T&& v) { return std::forward<T>(v); }

}  // namespace kl
