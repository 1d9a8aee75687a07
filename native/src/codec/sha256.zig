//! Streaming SHA-256 (FIPS 180-4) with a runtime-dispatched x86-64 SHA-NI block function
//! and a fast portable fallback. It is a drop-in replacement for
//! `std.crypto.hash.sha2.Sha256` on the cache write and validation paths.
//!
//! Why it exists: the library is built for `-Dcpu=baseline` x86-64 so that one wheel runs
//! on every x86-64 machine (and under valgrind). At baseline, std's Sha256 only has its
//! generic path, whose `round` spends most of its time copying the state and schedule
//! arrays. Most servers have the SHA extensions, so we detect them at run time.
//!
//! Layout:
//! - `Sha256` buffers partial blocks (so many small updates are cheap) and hands whole
//!   blocks straight from the caller's slice to the block function, many blocks per call.
//! - `shaNiBlocks`: SHA256RNDS2 / SHA256MSG1 / SHA256MSG2 plus SSSE3 PSHUFB/PALIGNR, all
//!   legacy-SSE encodings (no AVX needed). Written from Intel's description of the
//!   instructions. Each instruction is one small inline-asm statement on vector values so
//!   LLVM allocates registers and schedules; LLVM's assembler accepts these mnemonics even
//!   though the baseline target has the features off. Zig's self-hosted x86-64 backend
//!   (the default for Debug builds) refuses SHA mnemonics unless the comptime CPU has the
//!   `sha` feature, so with that backend SHA-NI is only compiled for such CPUs; every other
//!   Debug build uses the portable path (`zig build test` compiles with LLVM, so its
//!   Debug tests cover SHA-NI).
//! - `portableBlocks`: fully unrolled rounds (`inline for`), state and a 16-word rolling
//!   message schedule in locals, big-endian loads, no memcpy inside the compression loop.
//!
//! Dispatch: decided once per process (see `selected`). On non-x86-64 targets, or when the
//! comptime CPU already has SHA + SSSE3, the choice is static and no CPUID is executed.
//!
//! Developer override: setting the environment variable `DATASET_RT_NO_SHA_NI` to a
//! non-empty value other than "0" before the first hash forces the portable path (for
//! benchmarking, or tools that emulate CPUID but not the SHA instructions). It is read once,
//! together with CPUID, and is ignored when the choice is static.

const std = @import("std");
const builtin = @import("builtin");

/// Which block function a hasher uses.
pub const Implementation = enum(u8) {
    sha_ni = 1,
    portable = 2,

    pub fn name(self: Implementation) []const u8 {
        return switch (self) {
            .sha_ni => "sha-ni",
            .portable => "portable",
        };
    }
};

pub const Sha256 = struct {
    pub const digest_length = 32;
    pub const block_length = 64;

    state: [8]u32,
    buf: [64]u8 = undefined,
    /// Bytes pending in `buf`, always < 64 between calls.
    buf_len: usize = 0,
    /// Message length in bytes (mod 2^64).
    total_len: u64 = 0,
    impl: Implementation,

    pub fn init() Sha256 {
        return .{ .state = iv, .impl = selected() };
    }

    /// Uses a specific block function; for tests and benchmarks only (production code
    /// calls `init`). Panics if `.sha_ni` is requested where it is unavailable.
    pub fn initWith(impl: Implementation) Sha256 {
        if (impl == .sha_ni and !shaNiAvailable()) @panic("sha256: SHA-NI requested but unavailable");
        return .{ .state = iv, .impl = impl };
    }

    pub fn update(self: *Sha256, bytes: []const u8) void {
        self.total_len +%= bytes.len;
        var in = bytes;
        const have = self.buf_len;
        if (have != 0) {
            const need = 64 - have;
            if (in.len < need) {
                @memcpy(self.buf[have..][0..in.len], in);
                self.buf_len = have + in.len;
                return;
            }
            @memcpy(self.buf[have..], in[0..need]);
            compress(self.impl, &self.state, &self.buf, 1);
            in = in[need..];
        }
        const whole = in.len / 64;
        if (whole != 0) {
            compress(self.impl, &self.state, in.ptr, whole);
            in = in[whole * 64 ..];
        }
        @memcpy(self.buf[0..in.len], in);
        self.buf_len = in.len;
    }

    /// Writes the digest. The hasher must not be updated or finalized again afterwards.
    pub fn final(self: *Sha256, out: *[digest_length]u8) void {
        // Padding: 0x80, zeros, then the 64-bit big-endian bit length, filling one block
        // (if at least 9 bytes are free after the pending data) or two.
        var pad: [128]u8 = undefined;
        const n = self.buf_len;
        @memcpy(pad[0..n], self.buf[0..n]);
        pad[n] = 0x80;
        const blocks: usize = if (n + 9 <= 64) 1 else 2;
        const end = blocks * 64;
        @memset(pad[n + 1 .. end - 8], 0);
        std.mem.writeInt(u64, pad[end - 8 ..][0..8], self.total_len << 3, .big);
        compress(self.impl, &self.state, &pad, blocks);
        inline for (0..8) |i| std.mem.writeInt(u32, out[i * 4 ..][0..4], self.state[i], .big);
    }

    pub fn finalResult(self: *Sha256) [digest_length]u8 {
        var out: [digest_length]u8 = undefined;
        self.final(&out);
        return out;
    }

    pub fn hash(bytes: []const u8, out: *[digest_length]u8) void {
        var h = Sha256.init();
        h.update(bytes);
        h.final(out);
    }
};

/// Name of the block function `Sha256.init` uses in this process: "sha-ni" or "portable".
pub fn implementation() []const u8 {
    return selected().name();
}

/// Whether the SHA-NI block function is compiled in and the CPU supports it (ignores the
/// environment override).
pub fn shaNiAvailable() bool {
    if (!sha_ni_compiled) return false;
    if (static_choice) |c| return c == .sha_ni;
    return cpuHasShaNi();
}

// ---------------------------------------------------------------------------------------
// Dispatch

const is_x86_64 = builtin.cpu.arch == .x86_64;
const static_sha_ni = is_x86_64 and builtin.cpu.hasAll(.x86, &.{ .sha, .ssse3 });

/// Whether this compilation can emit `shaNiBlocks`: LLVM assembles SHA mnemonics for any
/// x86-64 CPU; the self-hosted backend only when the comptime CPU has the feature; the C
/// backend cannot pass vectors to inline asm.
const sha_ni_compiled = is_x86_64 and switch (builtin.zig_backend) {
    .stage2_llvm => true,
    .stage2_x86_64 => static_sha_ni,
    else => false,
};

/// Non-null when the choice needs no run-time check.
const static_choice: ?Implementation = if (!sha_ni_compiled)
    .portable
else if (static_sha_ni)
    .sha_ni
else
    null;

/// The only global state in this file: the run-time choice, 0 until first decided.
/// It caches a process-wide invariant (CPU features plus the environment at first use)
/// so that `init` does not execute CPUID each time: CPUID is serializing and, under
/// virtualization, traps to the hypervisor (microseconds), while hashers are created per
/// shard, index and metadata file. Racing first calls compute the same value, so plain
/// monotonic loads/stores suffice.
var selected_impl = std.atomic.Value(u8).init(0);

fn selected() Implementation {
    if (static_choice) |c| return c;
    const cached = selected_impl.load(.monotonic);
    if (cached != 0) return @enumFromInt(cached);
    const choice: Implementation = if (!envDisablesShaNi() and cpuHasShaNi()) .sha_ni else .portable;
    selected_impl.store(@intFromEnum(choice), .monotonic);
    return choice;
}

const override_env = "DATASET_RT_NO_SHA_NI";

fn envDisablesShaNi() bool {
    switch (builtin.os.tag) {
        .windows, .wasi, .uefi, .freestanding, .other => return false,
        else => {},
    }
    const value = std.posix.getenv(override_env) orelse return false;
    return value.len != 0 and !std.mem.eql(u8, value, "0");
}

const CpuidResult = struct { eax: u32, ebx: u32, ecx: u32, edx: u32 };

fn cpuid(leaf: u32, subleaf: u32) CpuidResult {
    var eax: u32 = undefined;
    var ebx: u32 = undefined;
    var ecx: u32 = undefined;
    var edx: u32 = undefined;
    asm volatile ("cpuid"
        : [eax] "={eax}" (eax),
          [ebx] "={ebx}" (ebx),
          [ecx] "={ecx}" (ecx),
          [edx] "={edx}" (edx),
        : [leaf] "{eax}" (leaf),
          [subleaf] "{ecx}" (subleaf),
    );
    return .{ .eax = eax, .ebx = ebx, .ecx = ecx, .edx = edx };
}

/// CPUID.1:ECX bit 9 = SSSE3 (PSHUFB, PALIGNR); CPUID.(EAX=7,ECX=0):EBX bit 29 = SHA.
/// SHA-NI only uses XMM registers, whose OS support is architectural on x86-64.
fn cpuHasShaNi() bool {
    if (!is_x86_64) return false;
    if (cpuid(0, 0).eax < 7) return false;
    const ssse3 = (cpuid(1, 0).ecx >> 9) & 1 != 0;
    const sha = (cpuid(7, 0).ebx >> 29) & 1 != 0;
    return ssse3 and sha;
}

inline fn compress(impl: Implementation, state: *[8]u32, data: [*]const u8, blocks: usize) void {
    if (sha_ni_compiled and impl == .sha_ni) {
        shaNiBlocks(state, data, blocks);
    } else {
        portableBlocks(state, data, blocks);
    }
}

// ---------------------------------------------------------------------------------------
// Constants

const iv = [8]u32{
    0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19,
};

const K = [64]u32{
    0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
    0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
    0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
    0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
    0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
    0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
    0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
    0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2,
};

// ---------------------------------------------------------------------------------------
// Portable block function

inline fn rotr(x: u32, comptime n: u5) u32 {
    return std.math.rotr(u32, x, n);
}

/// Slot in `v` holding working variable `role` (0 = a ... 7 = h) at round `t`: instead of
/// shifting eight variables every round, the names rotate over fixed slots.
fn slot(comptime role: usize, comptime t: usize) usize {
    return (role + 8 - t % 8) % 8;
}

fn portableBlocks(state: *[8]u32, data: [*]const u8, blocks: usize) void {
    var s = state.*;
    var p = data;
    var left = blocks;
    while (left != 0) : (left -= 1) {
        var w: [16]u32 = undefined;
        inline for (0..16) |i| w[i] = std.mem.readInt(u32, p[i * 4 ..][0..4], .big);
        var v = s;
        inline for (0..64) |t| {
            if (t >= 16) {
                const w15 = w[(t - 15) % 16];
                const w2 = w[(t - 2) % 16];
                const s0 = rotr(w15, 7) ^ rotr(w15, 18) ^ (w15 >> 3);
                const s1 = rotr(w2, 17) ^ rotr(w2, 19) ^ (w2 >> 10);
                w[t % 16] = w[t % 16] +% s0 +% w[(t - 7) % 16] +% s1;
            }
            const a = v[slot(0, t)];
            const b = v[slot(1, t)];
            const c = v[slot(2, t)];
            const e = v[slot(4, t)];
            const f = v[slot(5, t)];
            const g = v[slot(6, t)];
            const big_s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
            const ch = g ^ (e & (f ^ g));
            const t1 = v[slot(7, t)] +% big_s1 +% ch +% K[t] +% w[t % 16];
            const big_s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
            // Majority; `a ^ b` here is `b ^ c` of the next round, which LLVM reuses.
            const maj = b ^ ((a ^ b) & (b ^ c));
            v[slot(3, t)] +%= t1; // d + T1 becomes the next e
            v[slot(7, t)] = t1 +% big_s0 +% maj; // becomes the next a
        }
        inline for (0..8) |i| s[i] +%= v[i];
        p += 64;
    }
    state.* = s;
}

// ---------------------------------------------------------------------------------------
// SHA-NI block function
//
// SHA256RNDS2 keeps the state in two registers, ABEF = {A:127..96, B, E, F:31..0} and
// CDGH = {C, D, G, H}; as u32 lanes (lane 0 lowest) that is {F, E, B, A} and {H, G, D, C}.
// `sha256rnds2 src, dst` runs two rounds with dst = CDGH, src = ABEF and W+K for the two
// rounds in the low 64 bits of XMM0, and returns the new ABEF; the old ABEF is then the
// new CDGH, so alternating the two registers as destination needs no moves.
//
// Message schedule, four words per step, W[t..t+3] from the previous 16 words:
//   SHA256MSG1 dst=W[t-16..t-13], src=W[t-12..]  -> W[t-16+i] + s0(W[t-15+i])
//   PALIGNR 4 of (W[t-4..t-1] : W[t-8..t-5])     -> W[t-7..t-4]
//   SHA256MSG2 dst=sum, src=W[t-4..t-1]          -> adds s1(W[t-2+i]), feeding in its own
//                                                   results for W[t+2], W[t+3].

const V4 = @Vector(4, u32);

/// PSHUFB control reversing the bytes of each 32-bit lane (big-endian message words).
const bswap_mask: V4 = .{ 0x00010203, 0x04050607, 0x08090A0B, 0x0C0D0E0F };

const K4: [16]V4 = blk: {
    var out: [16]V4 = undefined;
    for (&out, 0..) |*q, i| q.* = K[4 * i ..][0..4].*;
    break :blk out;
};

inline fn pshufb(x: V4, mask: V4) V4 {
    return asm ("pshufb %[mask], %[x]"
        : [x] "=x" (-> V4),
        : [_] "0" (x),
          [mask] "x" (mask),
    );
}

/// (hi:lo) >> 32 bits, i.e. lanes {lo[1], lo[2], lo[3], hi[0]}.
inline fn alignr4(hi: V4, lo: V4) V4 {
    return asm ("palignr $4, %[lo], %[hi]"
        : [hi] "=x" (-> V4),
        : [_] "0" (hi),
          [lo] "x" (lo),
    );
}

inline fn msg1(w0: V4, w4: V4) V4 {
    return asm ("sha256msg1 %[w4], %[w0]"
        : [w0] "=x" (-> V4),
        : [_] "0" (w0),
          [w4] "x" (w4),
    );
}

inline fn msg2(sum: V4, w12: V4) V4 {
    return asm ("sha256msg2 %[w12], %[sum]"
        : [sum] "=x" (-> V4),
        : [_] "0" (sum),
          [w12] "x" (w12),
    );
}

/// Two rounds; returns the new ABEF.
inline fn rnds2(cdgh: V4, abef: V4, wk: V4) V4 {
    return asm ("sha256rnds2 %[abef], %[cdgh]"
        : [cdgh] "=x" (-> V4),
        : [_] "0" (cdgh),
          [abef] "x" (abef),
          [wk] "{xmm0}" (wk),
    );
}

fn shaNiBlocks(state: *[8]u32, data: [*]const u8, blocks: usize) void {
    const abcd: V4 = state[0..4].*;
    const efgh: V4 = state[4..8].*;
    var abef: V4 = @shuffle(u32, abcd, efgh, [4]i32{ ~@as(i32, 1), ~@as(i32, 0), 1, 0 });
    var cdgh: V4 = @shuffle(u32, abcd, efgh, [4]i32{ ~@as(i32, 3), ~@as(i32, 2), 3, 2 });
    const mask = bswap_mask;

    var p = data;
    var left = blocks;
    while (left != 0) : (left -= 1) {
        const abef_in = abef;
        const cdgh_in = cdgh;
        // m[k % 4] holds W[4k..4k+3] once step k has produced it.
        var m: [4]V4 = undefined;
        inline for (0..4) |i| {
            const src: *align(1) const V4 = @ptrCast(p + 16 * i);
            m[i] = pshufb(src.*, mask);
        }
        inline for (0..16) |k| {
            if (k >= 4) {
                const sum = msg1(m[k % 4], m[(k + 1) % 4]) +% alignr4(m[(k + 3) % 4], m[(k + 2) % 4]);
                m[k % 4] = msg2(sum, m[(k + 3) % 4]);
            }
            const wk = m[k % 4] +% K4[k];
            cdgh = rnds2(cdgh, abef, wk);
            abef = rnds2(abef, cdgh, @shuffle(u32, wk, undefined, [4]i32{ 2, 3, 2, 3 }));
        }
        abef +%= abef_in;
        cdgh +%= cdgh_in;
        p += 64;
    }

    const abcd_out: V4 = @shuffle(u32, abef, cdgh, [4]i32{ 3, 2, ~@as(i32, 3), ~@as(i32, 2) });
    const efgh_out: V4 = @shuffle(u32, abef, cdgh, [4]i32{ 1, 0, ~@as(i32, 1), ~@as(i32, 0) });
    state[0..4].* = abcd_out;
    state[4..8].* = efgh_out;
}

// ---------------------------------------------------------------------------------------
// Tests

const testing = std.testing;
const StdSha256 = std.crypto.hash.sha2.Sha256;

/// The implementations to check on this machine: always portable, SHA-NI when available.
fn testImpls() []const Implementation {
    const all = comptime [_]Implementation{ .portable, .sha_ni };
    return if (shaNiAvailable()) all[0..] else all[0..1];
}

fn hexDigest(impl: Implementation, msg: []const u8) [64]u8 {
    var h = Sha256.initWith(impl);
    h.update(msg);
    return std.fmt.bytesToHex(h.finalResult(), .lower);
}

test "sha256: dispatch matches cpuid" {
    const expect_sha_ni = sha_ni_compiled and
        (static_choice == Implementation.sha_ni or (cpuHasShaNi() and !envDisablesShaNi()));
    try testing.expectEqualStrings(if (expect_sha_ni) "sha-ni" else "portable", implementation());
    // On x86-64 with the LLVM backend the SHA-NI path must be in use wherever the CPU has it.
    if (is_x86_64 and builtin.zig_backend == .stage2_llvm and cpuHasShaNi()) {
        try testing.expect(shaNiAvailable());
        if (!envDisablesShaNi()) try testing.expectEqual(Implementation.sha_ni, Sha256.init().impl);
    }
    try testing.expectEqual(selected(), Sha256.init().impl);
}

test "sha256: NIST vectors" {
    const cases = [_]struct { msg: []const u8, hex: *const [64]u8 }{
        .{ .msg = "", .hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
        .{ .msg = "abc", .hex = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
        .{
            .msg = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
            .hex = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
        },
        .{
            .msg = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
            .hex = "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1",
        },
    };
    for (testImpls()) |impl| {
        for (cases) |case| try testing.expectEqualStrings(case.hex, &hexDigest(impl, case.msg));

        // One million 'a': as one slice, and as 1000 updates of 1000 bytes.
        const million = try testing.allocator.alloc(u8, 1_000_000);
        defer testing.allocator.free(million);
        @memset(million, 'a');
        const want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
        try testing.expectEqualStrings(want, &hexDigest(impl, million));
        var h = Sha256.initWith(impl);
        for (0..1000) |_| h.update(million[0..1000]);
        try testing.expectEqualStrings(want, &std.fmt.bytesToHex(h.finalResult(), .lower));
    }
    // The public one-shot API uses the dispatched implementation.
    var out: [32]u8 = undefined;
    Sha256.hash("abc", &out);
    try testing.expectEqualStrings("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", &std.fmt.bytesToHex(out, .lower));
}

test "sha256: every length 0..300 and random split points match std" {
    var prng = std.Random.DefaultPrng.init(0x5ba256_0001);
    const random = prng.random();
    var data: [300]u8 = undefined;
    for (testImpls()) |impl| {
        for (0..301) |len| {
            const msg = data[0..len];
            random.bytes(msg);
            var want: [32]u8 = undefined;
            StdSha256.hash(msg, &want, .{});

            var one = Sha256.initWith(impl);
            one.update(msg);
            try testing.expectEqual(want, one.finalResult());

            // One random split, then several random multi-way splits (including empty pieces).
            for (0..8) |round| {
                var h = Sha256.initWith(impl);
                var off: usize = 0;
                while (off < len) {
                    const max_piece = if (round == 0) len - off else @min(len - off, 80);
                    const piece = random.uintAtMost(usize, max_piece);
                    h.update(msg[off..][0..piece]);
                    off += piece;
                }
                h.update(msg[len..]);
                try testing.expectEqual(want, h.finalResult());
            }
        }
    }
}

test "sha256: 10 MiB in random-size chunks matches std" {
    const size = 10 << 20;
    const data = try testing.allocator.alloc(u8, size);
    defer testing.allocator.free(data);
    var prng = std.Random.DefaultPrng.init(0x5ba256_0002);
    const random = prng.random();
    random.bytes(data);
    var want: [32]u8 = undefined;
    StdSha256.hash(data, &want, .{});

    for (testImpls()) |impl| {
        try testing.expectEqual(want, blk: {
            var h = Sha256.initWith(impl);
            h.update(data);
            break :blk h.finalResult();
        });
        var h = Sha256.initWith(impl);
        var off: usize = 0;
        while (off < size) {
            // Mostly small and mid-size chunks, sometimes large ones.
            const limit: usize = switch (random.uintLessThan(u8, 4)) {
                0 => 64,
                1 => 700,
                2 => 9000,
                else => 300_000,
            };
            const piece = @min(size - off, random.uintAtMost(usize, limit));
            h.update(data[off..][0..piece]);
            off += piece;
        }
        try testing.expectEqual(want, h.finalResult());
    }
}
