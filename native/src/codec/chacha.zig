//! ChaCha8 random generator, bit-exact with rand_chacha 0.3 `ChaCha8Rng` seeded through
//! rand_core 0.6 `SeedableRng::seed_from_u64` (see dataset-rt-0.4.8.md section 3.3).
//!
//! Layout of the ChaCha state: the four "expand 32-byte k" constants, the 8 key words, a
//! 64-bit block counter in words 12-13 starting at 0, and stream (nonce) 0 in words 14-15.
//! 8 rounds (4 double rounds). Output words are consumed in order, one block at a time.
//!
//! rand_chacha buffers four blocks per refill, but blocks are consecutive, so producing one
//! 16-word block at a time gives the same word stream. That matters here: the sampler
//! creates a fresh generator per draw and usually needs only one or two `u64`, so the cost
//! of a draw is one block instead of four.

const std = @import("std");

/// The ChaCha constants "expand 32-byte k" as little-endian words.
const sigma = [4]u32{ 0x61707865, 0x3320646E, 0x79622D32, 0x6B206574 };

const words_per_block = 16;

/// rand_core's PCG32 seeding LCG: `state = state * pcg_mul + pcg_inc`.
const pcg_mul: u64 = 6364136223846793005;
const pcg_inc: u64 = 11634580027462260723;

/// `lcg_jumps[k]` maps the seed to the LCG state after k+1 steps.
const lcg_jumps = blk: {
    var jumps: [8]struct { mul: u64, add: u64 } = undefined;
    var mul: u64 = 1;
    var add: u64 = 0;
    for (&jumps) |*jump| {
        mul *%= pcg_mul;
        add = add *% pcg_mul +% pcg_inc;
        jump.* = .{ .mul = mul, .add = add };
    }
    break :blk jumps;
};

pub const ChaCha8 = struct {
    key: [8]u32,
    /// Number of the next block to generate.
    counter: u64,
    /// The current block's output words.
    buf: [words_per_block]u32,
    /// Index of the next unread word in `buf`; `words_per_block` when it is used up.
    pos: u32,

    /// rand_core 0.6 `seed_from_u64`: eight PCG32 (XSH-RR) outputs of a 64-bit LCG form the
    /// eight little-endian key words. The k-th LCG state is computed directly as
    /// `seed * mul^k + inc * (mul^(k-1) + ... + 1)` (mod 2^64), which is the same value as
    /// k sequential steps but keeps the eight multiplies independent.
    pub fn seedFromU64(seed: u64) ChaCha8 {
        var key: [8]u32 = undefined;
        inline for (&key, lcg_jumps) |*word, jump| {
            const state = seed *% jump.mul +% jump.add;
            const xorshifted: u32 = @truncate(((state >> 18) ^ state) >> 27);
            const rot: u5 = @intCast(state >> 59);
            word.* = std.math.rotr(u32, xorshifted, rot);
        }
        return .{ .key = key, .counter = 0, .buf = undefined, .pos = words_per_block };
    }

    pub fn nextU32(self: *ChaCha8) u32 {
        if (self.pos >= words_per_block) self.refill();
        const value = self.buf[self.pos];
        self.pos += 1;
        return value;
    }

    /// Two consecutive output words, low word first (rand_core `BlockRng::next_u64`,
    /// including across a block boundary).
    pub fn nextU64(self: *ChaCha8) u64 {
        if (self.pos + 2 <= words_per_block) {
            const low = self.buf[self.pos];
            const high = self.buf[self.pos + 1];
            self.pos += 2;
            return @as(u64, high) << 32 | low;
        }
        const low = self.nextU32();
        const high = self.nextU32();
        return @as(u64, high) << 32 | low;
    }

    fn refill(self: *ChaCha8) void {
        block(&self.key, self.counter, &self.buf);
        self.counter +%= 1;
        self.pos = 0;
    }
};

const Row = @Vector(4, u32);

inline fn rotl(v: Row, comptime n: u5) Row {
    return (v << @splat(n)) | (v >> @splat(32 - @as(u6, n)));
}

/// One ChaCha8 block. The state is held as four row vectors; a column round works on all
/// four columns at once, and the diagonal round rotates rows 1-3 so diagonals become
/// columns.
fn block(key: *const [8]u32, counter: u64, out: *[words_per_block]u32) void {
    const in_a: Row = sigma;
    const in_b: Row = key[0..4].*;
    const in_c: Row = key[4..8].*;
    const in_d: Row = .{ @truncate(counter), @truncate(counter >> 32), 0, 0 };
    var a = in_a;
    var b = in_b;
    var c = in_c;
    var d = in_d;
    inline for (0..4) |_| {
        // Column round.
        a +%= b;
        d = rotl(d ^ a, 16);
        c +%= d;
        b = rotl(b ^ c, 12);
        a +%= b;
        d = rotl(d ^ a, 8);
        c +%= d;
        b = rotl(b ^ c, 7);
        // Diagonal round: lane i of b, c, d moves to lane i-1, i-2, i-3.
        b = @shuffle(u32, b, undefined, [4]i32{ 1, 2, 3, 0 });
        c = @shuffle(u32, c, undefined, [4]i32{ 2, 3, 0, 1 });
        d = @shuffle(u32, d, undefined, [4]i32{ 3, 0, 1, 2 });
        a +%= b;
        d = rotl(d ^ a, 16);
        c +%= d;
        b = rotl(b ^ c, 12);
        a +%= b;
        d = rotl(d ^ a, 8);
        c +%= d;
        b = rotl(b ^ c, 7);
        b = @shuffle(u32, b, undefined, [4]i32{ 3, 0, 1, 2 });
        c = @shuffle(u32, c, undefined, [4]i32{ 2, 3, 0, 1 });
        d = @shuffle(u32, d, undefined, [4]i32{ 1, 2, 3, 0 });
    }
    out[0..4].* = a +% in_a;
    out[4..8].* = b +% in_b;
    out[8..12].* = c +% in_c;
    out[12..16].* = d +% in_d;
}

// ---------------------------------------------------------------------------------------
// Tests

const testing = std.testing;

/// Straightforward scalar ChaCha8 block, used only to cross-check the vector version.
fn scalarBlock(key: *const [8]u32, counter: u64) [words_per_block]u32 {
    const input = sigma ++ key.* ++ [4]u32{ @truncate(counter), @truncate(counter >> 32), 0, 0 };
    var x = input;
    const qr = struct {
        fn f(s: *[16]u32, a: usize, b: usize, c: usize, d: usize) void {
            s[a] +%= s[b];
            s[d] = std.math.rotl(u32, s[d] ^ s[a], 16);
            s[c] +%= s[d];
            s[b] = std.math.rotl(u32, s[b] ^ s[c], 12);
            s[a] +%= s[b];
            s[d] = std.math.rotl(u32, s[d] ^ s[a], 8);
            s[c] +%= s[d];
            s[b] = std.math.rotl(u32, s[b] ^ s[c], 7);
        }
    }.f;
    for (0..4) |_| {
        qr(&x, 0, 4, 8, 12);
        qr(&x, 1, 5, 9, 13);
        qr(&x, 2, 6, 10, 14);
        qr(&x, 3, 7, 11, 15);
        qr(&x, 0, 5, 10, 15);
        qr(&x, 1, 6, 11, 12);
        qr(&x, 2, 7, 8, 13);
        qr(&x, 3, 4, 9, 14);
    }
    for (&x, input) |*w, i| w.* +%= i;
    return x;
}

test "seed_from_u64 key words for seed 42 (reference 3.3)" {
    const rng = ChaCha8.seedFromU64(42);
    try testing.expectEqualSlices(u32, &.{
        0x7ba18fa4, 0x0a3d3258, 0xcca1b8ea, 0xb8140169,
        0x75c88c2b, 0x54f7b418, 0xa16e448d, 0xf220dfe4,
    }, &rng.key);
}

test "seed_from_u64 jump constants match eight sequential LCG steps" {
    for ([_]u64{ 0, 1, 42, 0xDEADBEEF, std.math.maxInt(u64) }) |seed| {
        var state = seed;
        const rng = ChaCha8.seedFromU64(seed);
        for (rng.key) |word| {
            state = state *% pcg_mul +% pcg_inc;
            const xorshifted: u32 = @truncate(((state >> 18) ^ state) >> 27);
            try testing.expectEqual(std.math.rotr(u32, xorshifted, @as(u5, @intCast(state >> 59))), word);
        }
    }
}

test "first next_u64 values for seed 42 (reference 3.3)" {
    var rng = ChaCha8.seedFromU64(42);
    try testing.expectEqual(@as(u64, 0xae90bfb5395d5ba1), rng.nextU64());
    try testing.expectEqual(@as(u64, 0xf3453fc625799188), rng.nextU64());
    try testing.expectEqual(@as(u64, 0x6d71b708c5b6538c), rng.nextU64());
}

test "draw 1 of seed 42 uses seed 4294967338 (reference 3.3)" {
    var rng = ChaCha8.seedFromU64(42 ^ (1 << 32));
    try testing.expectEqual(@as(u64, 0x80d61800276a1cb0), rng.nextU64());
}

test "next_u64 is two next_u32 calls, low first, across block boundaries" {
    var a = ChaCha8.seedFromU64(0xDEADBEEF);
    var b = ChaCha8.seedFromU64(0xDEADBEEF);
    // Offset by one word so every other u64 straddles a block boundary.
    _ = a.nextU32();
    _ = b.nextU32();
    for (0..200) |_| {
        const low = b.nextU32();
        const high = b.nextU32();
        try testing.expectEqual(@as(u64, high) << 32 | low, a.nextU64());
    }
}

test "vector block matches the scalar reference for many keys and counters" {
    var rng = ChaCha8.seedFromU64(7);
    for (0..64) |i| {
        var key: [8]u32 = undefined;
        for (&key) |*w| w.* = rng.nextU32();
        const counter: u64 = if (i % 4 == 3) rng.nextU64() else i;
        var got: [16]u32 = undefined;
        block(&key, counter, &got);
        const want = scalarBlock(&key, counter);
        try testing.expectEqualSlices(u32, &want, &got);
    }
}

test "word stream continues with consecutive block counters" {
    var rng = ChaCha8.seedFromU64(2);
    for (0..5) |counter| {
        const want = scalarBlock(&rng.key, counter);
        for (want) |w| try testing.expectEqual(w, rng.nextU32());
    }
}
