//! LZ4 block codec (compressor and bounds-checked decompressor), written from the LZ4
//! block format description. Cache record payloads are stored as a little-endian u32
//! uncompressed length followed by one LZ4 block, which is byte-compatible with
//! lz4_flex's `compress_prepend_size` / `decompress_size_prepended` and with python-lz4's
//! `lz4.block.compress(data, store_size=True)` / `lz4.block.decompress`.
//!
//! A block is a series of sequences. Each sequence is a token byte (high nibble: literal
//! count, low nibble: match length minus 4; a nibble of 15 is continued by extension
//! bytes that are added until one is not 255), the literal bytes, a 2-byte little-endian
//! match offset, and the match length extension. The final sequence holds only literals
//! and ends the block, so an empty input encodes to the single token byte 0.
//!
//! Invariants:
//! - Blocks written by the compressor obey the end-of-block rules that strict decoders
//!   (liblz4) enforce: the last 5 bytes are always literals, no match starts within the
//!   last 12 bytes, inputs shorter than 13 bytes are stored as literals only, and every
//!   offset is in 1..65535.
//! - The decompressor never reads or writes outside its slices for any input: every
//!   length, offset and extension byte is checked before use, so corrupted input yields a
//!   `DecodeError` rather than a panic. It is deliberately lenient about the end-of-block
//!   rules, so it accepts any block that decodes to exactly the requested size.
//! - Nothing allocates and there is no global mutable state; the compressor's hash table
//!   lives in a caller-owned `Compressor` (or on the stack for `compressBlock`).

const std = @import("std");
const assert = std.debug.assert;

/// Every way a block or a size-prepended payload can fail to decode.
pub const DecodeError = error{
    /// The payload is shorter than its 4-byte length prefix.
    MissingSizePrefix,
    /// The block ends in the middle of a sequence (token, literals, offset or length).
    TruncatedInput,
    /// A match has offset 0, which the format forbids.
    ZeroOffset,
    /// A match refers to bytes before the start of the output.
    OffsetBeyondOutput,
    /// The block would produce more bytes than the destination holds.
    OutputOverrun,
    /// The block (or the size prefix) disagrees with the expected decoded size.
    SizeMismatch,
};

/// Human-readable detail for an error, e.g. "match offset 0 is invalid"; used after the
/// prefix "failed to decompress lz4 payload: ".
/// Postcondition: the result is a non-empty static string without a trailing period.
pub fn describe(err: DecodeError) []const u8 {
    return switch (err) {
        error.MissingSizePrefix => "payload is shorter than its 4-byte size prefix",
        error.TruncatedInput => "block ends in the middle of a sequence",
        error.ZeroOffset => "match offset 0 is invalid",
        error.OffsetBeyondOutput => "match offset points before the start of the output",
        error.OutputOverrun => "block decodes to more bytes than the expected size",
        error.SizeMismatch => "decoded size does not match the expected size",
    };
}

/// Shortest match the format can express (the token stores length minus 4).
const min_match: usize = 4;
/// The last 5 bytes of a block are always literals.
const last_literals: usize = 5;
/// No match may start within the last 12 bytes, so inputs under 13 bytes are all literals.
const match_margin: usize = 12;
/// Offsets are stored in 16 bits and 0 is invalid.
const max_offset: u32 = 65535;
/// 4096 u32 entries (16 KiB) keep the table in L1/L2 cache, as in the reference codec.
const max_hash_log: u5 = 12;
/// Small inputs use a smaller slice of the table so clearing it stays cheap.
const min_hash_log: u5 = 6;
/// After 2^skip_trigger failed probes the search step grows by one, which makes
/// incompressible data cheap to pass over.
const skip_trigger: u6 = 6;

/// Worst-case size of one block produced from `input_len` bytes.
/// Precondition: `input_len` is small enough that the result does not overflow `usize`.
/// Postcondition: `compressBlock` never writes more than this many bytes.
pub fn compressBound(input_len: usize) usize {
    // Literal runs cost one extension byte per 255 bytes; the constant covers the
    // token, the final run's first extension byte and rounding.
    return input_len + input_len / 255 + 16;
}

/// Worst-case size of a size-prepended payload: the 4-byte prefix plus one block.
/// Precondition: as for `compressBound`.
pub fn prependedBound(input_len: usize) usize {
    return 4 + compressBound(input_len);
}

/// Reusable compressor state: a hash table mapping short byte sequences to the last
/// position where they occurred. Declare it as `var c: Compressor = .{};` and reuse it
/// across calls to avoid touching a fresh 16 KiB of stack each time. The used part of the
/// table is cleared at the start of every call, so output depends only on the input,
/// never on earlier calls.
pub const Compressor = struct {
    /// Positions are stored truncated to u32; see `compress` for why that is safe.
    table: [1 << max_hash_log]u32 = undefined,

    /// Compresses `src` into `dst` as one LZ4 block and returns the number of bytes
    /// written. Cannot fail.
    /// Preconditions: `dst.len >= compressBound(src.len)`; `src` and `dst` do not overlap.
    /// Postcondition: `dst[0..result]` is a valid block that decodes to exactly `src`;
    /// bytes of `dst` past `result` may have been overwritten with scratch data.
    pub fn compress(self: *Compressor, src: []const u8, dst: []u8) usize {
        assert(dst.len >= compressBound(src.len));
        var out: usize = 0;
        var anchor: usize = 0; // First byte not yet emitted.

        if (src.len > match_margin) {
            const hash_log = hashLogFor(src.len);
            const table = self.table[0 .. @as(usize, 1) << hash_log];
            // Zero means "position 0"; a stale candidate is harmless because every
            // candidate is verified byte-for-byte, but clearing keeps output deterministic.
            @memset(table, 0);
            const shift: u5 = @intCast(32 - @as(u6, hash_log));
            // Matches may start only before `start_limit` and must end by `end_limit`.
            // `start_limit` is one byte stricter than liblz4's bound so that no match
            // begins inside the last 12 bytes under any reading of the rule.
            const start_limit = src.len - match_margin;
            const end_limit = src.len - last_literals;

            var pos: usize = 1;
            outer: while (true) {
                var probes: usize = @as(usize, 1) << skip_trigger;
                var candidate: usize = undefined;
                while (true) {
                    if (pos >= start_limit) break :outer;
                    const seq = read32(src, pos);
                    const slot = hashAt(src, pos, shift);
                    // Distances are computed modulo 2^32, so inputs over 4 GiB still work:
                    // a wrapped distance can only point at another position within 64 KiB,
                    // and any such position holding equal bytes is a valid match.
                    const distance = @as(u32, @truncate(pos)) -% table[slot];
                    table[slot] = @truncate(pos);
                    if (distance -% 1 < max_offset and distance <= pos and
                        read32(src, pos - distance) == seq)
                    {
                        candidate = pos - distance;
                        break;
                    }
                    pos += probes >> skip_trigger;
                    probes += 1;
                }

                // Grow the match backwards over bytes that would otherwise be literals.
                while (pos > anchor and candidate > 0 and src[pos - 1] == src[candidate - 1]) {
                    pos -= 1;
                    candidate -= 1;
                }
                const match_len = min_match +
                    commonLength(src, candidate + min_match, pos + min_match, end_limit);
                out = writeSequence(src, anchor, pos, dst, out, @intCast(pos - candidate), match_len);
                pos += match_len;
                anchor = pos;
                if (pos >= start_limit) break;
                // Index a position inside the match so that a repeat of its tail is found;
                // the next probe then tests `pos` itself for an immediate follow-on match.
                table[hashAt(src, pos - 2, shift)] = @truncate(pos - 2);
            }
        }

        return writeLastLiterals(src[anchor..], dst, out);
    }

    /// Writes `src.len` as a u32 little-endian prefix followed by one block of `src`, and
    /// returns the total number of bytes written.
    /// Preconditions: `src.len <= maxInt(u32)`; `dst.len >= prependedBound(src.len)`;
    /// `src` and `dst` do not overlap.
    /// Postcondition: `decompressPrepended(dst[0..result], out)` reproduces `src`.
    pub fn compressPrepended(self: *Compressor, src: []const u8, dst: []u8) usize {
        assert(src.len <= std.math.maxInt(u32));
        assert(dst.len >= prependedBound(src.len));
        std.mem.writeInt(u32, dst[0..4], @intCast(src.len), .little);
        return 4 + self.compress(src, dst[4..]);
    }
};

/// Compresses `src` into `dst` (dst.len >= compressBound(src.len)); returns bytes written.
/// Cannot fail. Uses a 16 KiB hash table on the stack, which safe builds fill on every
/// call (longer than compressing a short record takes): hold a `Compressor` instead to
/// reuse one table across calls.
/// Preconditions: `dst.len >= compressBound(src.len)`; `src` and `dst` do not overlap.
/// Postcondition: `dst[0..result]` is a valid block that decodes to exactly `src`;
/// bytes of `dst` past `result` may have been overwritten with scratch data.
pub fn compressBlock(src: []const u8, dst: []u8) usize {
    var compressor: Compressor = .{};
    return compressor.compress(src, dst);
}

/// Writes u32 LE length then one block of `src`; returns the total bytes written. A
/// `Compressor` per call, as `compressBlock`.
/// Preconditions: `src.len` fits in u32 (asserted); `dst.len >= prependedBound(src.len)`;
/// `src` and `dst` do not overlap.
/// Postcondition: the result is at least 5, and exactly 5 (`00 00 00 00 00`) for empty `src`.
pub fn compressPrepended(src: []const u8, dst: []u8) usize {
    var compressor: Compressor = .{};
    return compressor.compressPrepended(src, dst);
}

/// Reads the u32 little-endian uncompressed length at the start of a size-prepended
/// payload. Fails with `MissingSizePrefix` when `src` is shorter than 4 bytes.
/// Postcondition: the block itself has not been inspected, so it may still be invalid.
pub fn prependedSize(src: []const u8) DecodeError!u32 {
    if (src.len < 4) return error.MissingSizePrefix;
    return std.mem.readInt(u32, src[0..4], .little);
}

/// Decompresses a size-prepended payload into `dst`.
/// Precondition: `dst.len` must equal `prependedSize(src)`; otherwise `SizeMismatch` is
/// returned (not asserted), since the prefix comes from untrusted data.
/// Postcondition on success: all of `dst` holds the decoded bytes. On error the contents
/// of `dst` are unspecified but nothing outside it was written.
pub fn decompressPrepended(src: []const u8, dst: []u8) DecodeError!void {
    const size = try prependedSize(src);
    if (size != dst.len) return error.SizeMismatch;
    return decompressBlock(src[4..], dst);
}

/// Decompresses one block that must produce exactly `dst.len` bytes.
/// Accepts any input: bad blocks yield a `DecodeError`, never a panic or an access
/// outside `src` or `dst`.
/// Precondition: `src` and `dst` do not overlap.
/// Postcondition on success: all of `dst` holds the decoded bytes and all of `src` was
/// consumed. On error the contents of `dst` are unspecified.
pub fn decompressBlock(src: []const u8, dst: []u8) DecodeError!void {
    var ip: usize = 0;
    var op: usize = 0;
    while (true) {
        // A block always ends with a literal-only sequence, so running out of input
        // here (including right after a match) means the block was cut short.
        if (ip >= src.len) return error.TruncatedInput;
        const token = src[ip];
        ip += 1;

        var lit_len: usize = token >> 4;
        if (lit_len != 15 and src.len - ip >= 16 and dst.len - op >= 16) {
            // Short runs dominate; one fixed 16-byte copy is cheaper than a memcpy call,
            // and the bytes written past the run are overwritten by what follows.
            dst[op..][0..16].* = src[ip..][0..16].*;
        } else {
            if (lit_len == 15) lit_len = try readLengthExtension(src, &ip, 15, dst.len - op);
            if (lit_len > dst.len - op) return error.OutputOverrun;
            if (lit_len > src.len - ip) return error.TruncatedInput;
            @memcpy(dst[op..][0..lit_len], src[ip..][0..lit_len]);
        }
        ip += lit_len;
        op += lit_len;

        if (ip == src.len) {
            if (op != dst.len) return error.SizeMismatch;
            return;
        }

        if (src.len - ip < 2) return error.TruncatedInput;
        const offset: usize = std.mem.readInt(u16, src[ip..][0..2], .little);
        ip += 2;
        if (offset == 0) return error.ZeroOffset;
        if (offset > op) return error.OffsetBeyondOutput;

        var match_len: usize = (token & 15) + min_match;
        if (match_len != 15 + min_match and offset >= 16 and dst.len - op >= 24) {
            // A match of at most 18 bytes whose source starts at least 16 bytes back: two
            // fixed copies of 16 and 8 bytes never overlap their own source, and the
            // second reads only bytes that are final (earlier output or the first copy).
            const from = op - offset;
            dst[op..][0..16].* = dst[from..][0..16].*;
            dst[op + 16 ..][0..8].* = dst[from + 16 ..][0..8].*;
        } else {
            if (match_len == 15 + min_match) {
                match_len = try readLengthExtension(src, &ip, match_len, dst.len - op);
            }
            if (match_len > dst.len - op) return error.OutputOverrun;
            copyMatch(dst, op, offset, match_len);
        }
        op += match_len;
    }
}

/// Adds extension bytes to `base` until one is below 255. Stops as soon as the length
/// exceeds `room`, which both reports the overrun early and keeps the sum from
/// overflowing on long runs of 255 bytes.
fn readLengthExtension(src: []const u8, ip: *usize, base: usize, room: usize) DecodeError!usize {
    var len = base;
    var i = ip.*;
    while (true) {
        if (i >= src.len) return error.TruncatedInput;
        const byte = src[i];
        i += 1;
        len += byte;
        if (len > room) return error.OutputOverrun;
        if (byte != 255) break;
    }
    ip.* = i;
    return len;
}

/// Copies `len` bytes from `offset` bytes back to `dst[op..]`, where the source may
/// overlap the destination (offset < len repeats the last `offset` bytes).
/// Precondition: `1 <= offset <= op` and `op + len <= dst.len`.
fn copyMatch(dst: []u8, op: usize, offset: usize, len: usize) void {
    const from = op - offset;
    if (offset >= len) {
        @memcpy(dst[op..][0..len], dst[from..][0..len]);
        return;
    }
    if (offset == 1) {
        @memset(dst[op..][0..len], dst[from]);
        return;
    }
    // The bytes from `from` up to the write position repeat with period `offset`, and
    // `done` stays a multiple of `offset`, so copying that whole prefix again continues
    // the pattern. Each copy is disjoint from its source and doubles the prefix.
    var done: usize = 0;
    while (done < len) {
        const chunk = @min(offset + done, len - done);
        @memcpy(dst[op + done ..][0..chunk], dst[from..][0..chunk]);
        done += chunk;
    }
}

/// Picks the table size for an input: about one slot per input byte, clamped, so short
/// records do not pay for clearing the whole 16 KiB table.
fn hashLogFor(len: usize) u5 {
    var log: u5 = min_hash_log;
    while (log < max_hash_log and (@as(usize, 1) << log) < len) log += 1;
    return log;
}

/// Multiplicative hash of the 5 bytes at `pos`, keeping the top `32 - shift` bits of the
/// 64-bit product, which are the best mixed. Keying on 5 bytes rather than the 4 a
/// match needs means a slot is not taken over by 4-byte repeats that stop right there,
/// which on short-phrase data gave about 10% smaller output at the same speed (the same
/// choice liblz4 makes on 64-bit targets). Candidates are still verified on 4 bytes.
/// Precondition: `pos + 8 <= bytes.len`, which holds for every position that may start
/// a match because the last 12 bytes never do.
fn hashAt(bytes: []const u8, pos: usize, shift: u5) usize {
    const low5 = read64(bytes, pos) << 24;
    return @intCast((low5 *% 889523592379) >> (@as(u6, shift) + 32));
}

fn read32(bytes: []const u8, pos: usize) u32 {
    return std.mem.readInt(u32, bytes[pos..][0..4], .little);
}

fn read64(bytes: []const u8, pos: usize) u64 {
    return std.mem.readInt(u64, bytes[pos..][0..8], .little);
}

/// Number of equal bytes at `src[a..]` and `src[b..]`, counting only positions of `b`
/// below `limit`. Compares 8 bytes at a time; with little-endian loads the trailing zero
/// count of the XOR locates the first differing byte.
/// Precondition: `a < b <= limit <= src.len`.
fn commonLength(src: []const u8, a_start: usize, b_start: usize, limit: usize) usize {
    var a = a_start;
    var b = b_start;
    while (limit - b >= 8) {
        const diff = read64(src, a) ^ read64(src, b);
        if (diff != 0) return b - b_start + @ctz(diff) / 8;
        a += 8;
        b += 8;
    }
    while (b < limit and src[a] == src[b]) {
        a += 1;
        b += 1;
    }
    return b - b_start;
}

/// Writes a length beyond the nibble's 15 as a run of 255 bytes and a final byte < 255.
fn writeLengthExtension(dst: []u8, out: usize, extra: usize) usize {
    const full = extra / 255;
    @memset(dst[out..][0..full], 255);
    dst[out + full] = @intCast(extra % 255);
    return out + full + 1;
}

/// Emits one sequence: the literals `src[anchor..pos]` followed by a match of
/// `match_len` bytes at `offset`. Returns the new output position.
fn writeSequence(
    src: []const u8,
    anchor: usize,
    pos: usize,
    dst: []u8,
    out_start: usize,
    offset: u16,
    match_len: usize,
) usize {
    const lit_len = pos - anchor;
    const match_code = match_len - min_match;
    var out = out_start;
    dst[out] = (@as(u8, @intCast(@min(lit_len, 15))) << 4) | @as(u8, @intCast(@min(match_code, 15)));
    out += 1;
    if (lit_len >= 15) out = writeLengthExtension(dst, out, lit_len - 15);
    if (lit_len <= 16 and src.len - anchor >= 16 and dst.len - out >= 16) {
        // Same trick as the decoder: one fixed copy, the excess is overwritten next.
        dst[out..][0..16].* = src[anchor..][0..16].*;
    } else {
        @memcpy(dst[out..][0..lit_len], src[anchor..pos]);
    }
    out += lit_len;
    std.mem.writeInt(u16, dst[out..][0..2], offset, .little);
    out += 2;
    if (match_code >= 15) out = writeLengthExtension(dst, out, match_code - 15);
    return out;
}

/// Emits the final literal-only sequence that terminates every block.
fn writeLastLiterals(literals: []const u8, dst: []u8, out_start: usize) usize {
    var out = out_start;
    dst[out] = @as(u8, @intCast(@min(literals.len, 15))) << 4;
    out += 1;
    if (literals.len >= 15) out = writeLengthExtension(dst, out, literals.len - 15);
    @memcpy(dst[out..][0..literals.len], literals);
    return out + literals.len;
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

const testing = std.testing;

/// Parses a block the way a strict decoder does and checks the end-of-block rules that
/// the compressor promises (see the file header), so compatibility with liblz4 is tested
/// without linking it.
fn expectEndRules(block: []const u8, decoded_len: usize) !void {
    var ip: usize = 0;
    var op: usize = 0;
    while (true) {
        const token = block[ip];
        ip += 1;
        var lit: usize = token >> 4;
        if (lit == 15) {
            while (true) {
                const b = block[ip];
                ip += 1;
                lit += b;
                if (b != 255) break;
            }
        }
        ip += lit;
        op += lit;
        if (ip == block.len) break;
        const offset = std.mem.readInt(u16, block[ip..][0..2], .little);
        ip += 2;
        try testing.expect(offset >= 1 and offset <= op);
        var ml: usize = (token & 15) + min_match;
        if (ml == 19) {
            while (true) {
                const b = block[ip];
                ip += 1;
                ml += b;
                if (b != 255) break;
            }
        }
        // The match must start before the last 12 bytes and leave 5 literals after it.
        try testing.expect(op + match_margin < decoded_len);
        try testing.expect(op + ml + last_literals <= decoded_len);
        op += ml;
    }
    try testing.expectEqual(decoded_len, op);
}

/// Compresses `data` both bare and size-prepended, checks the bounds and the end rules,
/// and decodes both forms back.
fn expectRoundTrip(data: []const u8) !void {
    const gpa = testing.allocator;
    const block = try gpa.alloc(u8, compressBound(data.len));
    defer gpa.free(block);
    const n = compressBlock(data, block);
    try testing.expect(n <= compressBound(data.len));
    try expectEndRules(block[0..n], data.len);

    const out = try gpa.alloc(u8, data.len);
    defer gpa.free(out);
    try decompressBlock(block[0..n], out);
    try testing.expectEqualSlices(u8, data, out);

    const framed = try gpa.alloc(u8, prependedBound(data.len));
    defer gpa.free(framed);
    const m = compressPrepended(data, framed);
    try testing.expectEqual(n + 4, m);
    try testing.expectEqual(@as(u32, @intCast(data.len)), try prependedSize(framed[0..m]));
    @memset(out, 0xAA);
    try decompressPrepended(framed[0..m], out);
    try testing.expectEqualSlices(u8, data, out);
}

fn fillRandom(random: std.Random, buf: []u8) void {
    random.bytes(buf);
}

/// Text-like data with many repeats at varying distances and lengths.
fn fillCompressible(random: std.Random, buf: []u8) void {
    const words = [_][]const u8{ "sample", "label", "image", "0.25", "train", "val", ",", ";", "\n", "id=" };
    var i: usize = 0;
    while (i < buf.len) {
        const word = words[random.uintLessThan(usize, words.len)];
        const n = @min(word.len, buf.len - i);
        @memcpy(buf[i..][0..n], word[0..n]);
        i += n;
        if (i < buf.len and random.uintLessThan(u8, 8) == 0) {
            buf[i] = random.int(u8);
            i += 1;
        }
    }
}

test "empty input encodes to the 5-byte golden payload" {
    var framed: [prependedBound(0)]u8 = undefined;
    const n = compressPrepended("", &framed);
    try testing.expectEqualSlices(u8, &.{ 0, 0, 0, 0, 0 }, framed[0..n]);
    try decompressPrepended(framed[0..n], &.{});

    var block: [compressBound(0)]u8 = undefined;
    try testing.expectEqual(@as(usize, 1), compressBlock("", &block));
    try testing.expectEqual(@as(u8, 0), block[0]);
    try decompressBlock(block[0..1], &.{});
}

test "round trip tiny inputs" {
    try expectRoundTrip("");
    try expectRoundTrip("x");
    try expectRoundTrip("ab");
    try expectRoundTrip("hello");
    try expectRoundTrip("hello hello hello hello hello hello");
}

test "round trip sizes around the 12-byte and 5-byte end rules" {
    var prng = std.Random.DefaultPrng.init(0x5eed_0001);
    var buf: [64]u8 = undefined;
    for (0..buf.len + 1) |len| {
        // Repetitive inputs are the ones that tempt a compressor to match near the end.
        @memset(buf[0..len], 'a');
        try expectRoundTrip(buf[0..len]);
        for (buf[0..len], 0..) |*b, i| b.* = "abc"[i % 3];
        try expectRoundTrip(buf[0..len]);
        fillRandom(prng.random(), buf[0..len]);
        try expectRoundTrip(buf[0..len]);
        // A random head followed by a repeat that reaches right up to the end.
        if (len >= 8) {
            const half = len / 2;
            @memcpy(buf[len - half .. len], buf[0..half]);
            try expectRoundTrip(buf[0..len]);
        }
    }
    // With exactly 13 repeated bytes a match is possible but must leave 5 literals.
    const thirteen = "aaaaaaaaaaaaa";
    var block: [compressBound(thirteen.len)]u8 = undefined;
    const n = compressBlock(thirteen, &block);
    try expectEndRules(block[0..n], thirteen.len);
}

test "round trip random, compressible and overlapping data of many sizes" {
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(0x5eed_0002);
    const random = prng.random();
    const sizes = [_]usize{ 100, 1000, 4095, 4096, 4097, 65535, 65536, 65537, 65540, 70000, 200_000, 1 << 20 };
    for (sizes) |size| {
        const buf = try gpa.alloc(u8, size);
        defer gpa.free(buf);
        fillRandom(random, buf);
        try expectRoundTrip(buf);
        fillCompressible(random, buf);
        try expectRoundTrip(buf);
        @memset(buf, 0);
        try expectRoundTrip(buf);
        // Short periods force overlapping matches with offsets 2..7.
        for (buf, 0..) |*b, i| b.* = @intCast(i % (2 + size % 6));
        try expectRoundTrip(buf);
    }
}

test "highly compressible data compresses well and long matches use extensions" {
    const gpa = testing.allocator;
    const buf = try gpa.alloc(u8, 1 << 20);
    defer gpa.free(buf);
    @memset(buf, 7);
    const block = try gpa.alloc(u8, compressBound(buf.len));
    defer gpa.free(block);
    const n = compressBlock(buf, block);
    try testing.expect(n < buf.len / 200);
    try expectRoundTrip(buf);
}

test "matches never reach farther back than 65535 bytes" {
    // A random 70000-byte chunk repeated: the only long repeats are 70000 bytes back, out
    // of reach, so any match the compressor emitted that far would corrupt the round trip.
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(0x5eed_0003);
    const chunk = 70_000;
    const buf = try gpa.alloc(u8, chunk * 3);
    defer gpa.free(buf);
    fillRandom(prng.random(), buf[0..chunk]);
    @memcpy(buf[chunk .. 2 * chunk], buf[0..chunk]);
    @memcpy(buf[2 * chunk ..], buf[0..chunk]);
    try expectRoundTrip(buf);
    // A random chunk repeated at exactly the maximum distance must be found; zeros in
    // between keep the hash table entries of the chunk from being overwritten. At one
    // byte farther the repeat is out of reach and must be stored as literals.
    for ([_]usize{ 65535, 65536 }) |distance| {
        const near = try gpa.alloc(u8, distance + 1000);
        defer gpa.free(near);
        @memset(near, 0);
        fillRandom(prng.random(), near[0..1000]);
        @memcpy(near[distance..], near[0..1000]);
        const block = try gpa.alloc(u8, compressBound(near.len));
        defer gpa.free(block);
        const n = compressBlock(near, block);
        if (distance == 65535) try testing.expect(n < 1700) else try testing.expect(n > 2000);
        try expectRoundTrip(near);
    }
}

test "a reused compressor gives the same output as a fresh one" {
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(0x5eed_0004);
    const a = try gpa.alloc(u8, 50_000);
    defer gpa.free(a);
    const b = try gpa.alloc(u8, 300);
    defer gpa.free(b);
    fillCompressible(prng.random(), a);
    fillCompressible(prng.random(), b);
    const fresh = try gpa.alloc(u8, compressBound(a.len));
    defer gpa.free(fresh);
    const reused = try gpa.alloc(u8, compressBound(a.len));
    defer gpa.free(reused);
    var compressor: Compressor = .{};
    _ = compressor.compress(a, reused);
    _ = compressor.compress(b, reused);
    const n1 = compressor.compress(b, reused);
    const n2 = compressBlock(b, fresh);
    try testing.expectEqualSlices(u8, fresh[0..n2], reused[0..n1]);
    const m1 = compressor.compress(a, reused);
    const m2 = compressBlock(a, fresh);
    try testing.expectEqualSlices(u8, fresh[0..m2], reused[0..m1]);
}

test "golden: literal-only block" {
    var out: [5]u8 = undefined;
    try decompressBlock("\x50hello", &out);
    try testing.expectEqualStrings("hello", &out);
}

test "golden: overlapping match with offset 1 and with offset 3" {
    // 'a', then a match of 4+6 bytes at offset 1, then the literals "xyzzy".
    var out: [16]u8 = undefined;
    try decompressBlock("\x16a\x01\x00\x50xyzzy", &out);
    try testing.expectEqualStrings("aaaaaaaaaaaxyzzy", &out);
    // "abc", then a match of 4+5 bytes at offset 3 (longer than its offset), then "!".
    var out2: [13]u8 = undefined;
    try decompressBlock("\x35abc\x03\x00\x10!", &out2);
    try testing.expectEqualStrings("abcabcabcabc!", &out2);
}

test "golden: long literal run needing 255-extension bytes" {
    // 15 + 255 + 30 = 300 literals in one sequence.
    var block: [3 + 300]u8 = undefined;
    block[0] = 0xF0;
    block[1] = 255;
    block[2] = 30;
    for (block[3..], 0..) |*b, i| b.* = @truncate(i * 7 + 1);
    var out: [300]u8 = undefined;
    try decompressBlock(&block, &out);
    try testing.expectEqualSlices(u8, block[3..], &out);
    // An extension of exactly 255 must be followed by a terminating 0 byte.
    var block2: [3 + 270 + 1]u8 = undefined;
    block2[0] = 0xF0;
    block2[1] = 255;
    block2[2] = 0;
    @memset(block2[3..], 'z');
    var out2: [270]u8 = undefined;
    try decompressBlock(block2[0..273], &out2);
    for (out2) |b| try testing.expectEqual(@as(u8, 'z'), b);
    // One stray byte after the literals reads as half of a match offset.
    try testing.expectError(error.TruncatedInput, decompressBlock(&block2, &out2));
}

test "golden: long match length extension" {
    // "ab", then a match of 4 + 15 + 255 + 255 + 10 = 539 bytes at offset 2, then an
    // empty final literal run.
    const block = "\x2Fab\x02\x00\xFF\xFF\x0A\x00";
    var out: [541]u8 = undefined;
    try decompressBlock(block, &out);
    for (out, 0..) |b, i| try testing.expectEqual("ab"[i % 2], b);
}

test "golden: blocks written by python-lz4 4.4.5 (store_size=True)" {
    // Generated with lz4.block.compress(data, store_size=True, mode=...). The inputs are
    // rebuilt below so the test checks content, not only length.
    const text = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog again!";
    const text_block = [_]u8{
        0x5f, 0x00, 0x00, 0x00, 0xff, 0x1e, 0x54, 0x68, 0x65, 0x20, 0x71, 0x75, 0x69, 0x63, 0x6b, 0x20,
        0x62, 0x72, 0x6f, 0x77, 0x6e, 0x20, 0x66, 0x6f, 0x78, 0x20, 0x6a, 0x75, 0x6d, 0x70, 0x73, 0x20,
        0x6f, 0x76, 0x65, 0x72, 0x20, 0x74, 0x68, 0x65, 0x20, 0x6c, 0x61, 0x7a, 0x79, 0x20, 0x64, 0x6f,
        0x67, 0x2e, 0x20, 0x2d, 0x00, 0x18, 0x70, 0x20, 0x61, 0x67, 0x61, 0x69, 0x6e, 0x21,
    };
    // b"a" * 300: one literal, then a long offset-1 match.
    const run_block = [_]u8{ 0x2c, 0x01, 0x00, 0x00, 0x1f, 0x61, 0x01, 0x00, 0xff, 0x14, 0x50, 0x61, 0x61, 0x61, 0x61, 0x61 };
    // bytes(range(256)) * 2: a 256-byte literal run (extension 0xf1), then a match.
    const bytes_block = [_]u8{
        0x00, 0x02, 0x00, 0x00, 0xff, 0xf1, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09,
        0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19,
        0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29,
        0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39,
        0x3a, 0x3b, 0x3c, 0x3d, 0x3e, 0x3f, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49,
        0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59,
        0x5a, 0x5b, 0x5c, 0x5d, 0x5e, 0x5f, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69,
        0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79,
        0x7a, 0x7b, 0x7c, 0x7d, 0x7e, 0x7f, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89,
        0x8a, 0x8b, 0x8c, 0x8d, 0x8e, 0x8f, 0x90, 0x91, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99,
        0x9a, 0x9b, 0x9c, 0x9d, 0x9e, 0x9f, 0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9,
        0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9,
        0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9,
        0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9,
        0xda, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xe1, 0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9,
        0xea, 0xeb, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9,
        0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff, 0x00, 0x01, 0xe8, 0x50, 0xfb, 0xfc, 0xfd, 0xfe, 0xff,
    };
    // b"".join(b"record-%03d;" % (i % 7) for i in range(40)), default and high-compression.
    const mixed_block = [_]u8{
        0xb8, 0x01, 0x00, 0x00, 0xb5, 0x72, 0x65, 0x63, 0x6f, 0x72, 0x64, 0x2d, 0x30, 0x30, 0x30, 0x3b,
        0x0b, 0x00, 0x16, 0x31, 0x0b, 0x00, 0x16, 0x32, 0x0b, 0x00, 0x16, 0x33, 0x0b, 0x00, 0x16, 0x34,
        0x0b, 0x00, 0x16, 0x35, 0x0b, 0x00, 0x16, 0x36, 0x0b, 0x00, 0x0f, 0x4d, 0x00, 0xff, 0x4b, 0x50,
        0x2d, 0x30, 0x30, 0x34, 0x3b,
    };
    const mixed_hc_block = [_]u8{
        0xb8, 0x01, 0x00, 0x00, 0xb5, 0x72, 0x65, 0x63, 0x6f, 0x72, 0x64, 0x2d, 0x30, 0x30, 0x30, 0x3b,
        0x0b, 0x00, 0x16, 0x31, 0x0b, 0x00, 0x16, 0x32, 0x0b, 0x00, 0x16, 0x33, 0x0b, 0x00, 0x16, 0x34,
        0x0b, 0x00, 0x16, 0x35, 0x0b, 0x00, 0x2f, 0x36, 0x3b, 0x4d, 0x00, 0xff, 0x54, 0x50, 0x2d, 0x30,
        0x30, 0x34, 0x3b,
    };

    var run: [300]u8 = undefined;
    @memset(&run, 'a');
    var bytes: [512]u8 = undefined;
    for (&bytes, 0..) |*b, i| b.* = @truncate(i);
    var mixed: [440]u8 = undefined;
    for (0..40) |i| _ = std.fmt.bufPrint(mixed[i * 11 ..][0..11], "record-{d:0>3};", .{i % 7}) catch unreachable;

    const cases = [_]struct { block: []const u8, expected: []const u8 }{
        .{ .block = &text_block, .expected = text },
        .{ .block = &run_block, .expected = &run },
        .{ .block = &bytes_block, .expected = &bytes },
        .{ .block = &mixed_block, .expected = &mixed },
        .{ .block = &mixed_hc_block, .expected = &mixed },
    };
    var out: [512]u8 = undefined;
    for (cases) |case| {
        const size = try prependedSize(case.block);
        try testing.expectEqual(case.expected.len, size);
        try decompressPrepended(case.block, out[0..size]);
        try testing.expectEqualSlices(u8, case.expected, out[0..size]);
    }
}

test "rejects each class of malformed input" {
    var out: [512]u8 = undefined;
    // MissingSizePrefix: fewer than four bytes.
    try testing.expectError(error.MissingSizePrefix, prependedSize(""));
    try testing.expectError(error.MissingSizePrefix, decompressPrepended("\x05\x00\x00", out[0..5]));

    // TruncatedInput: empty block, missing literals, missing offset, missing extension
    // bytes, and a block that stops right after a match without its final sequence.
    try testing.expectError(error.TruncatedInput, decompressBlock("", out[0..0]));
    try testing.expectError(error.TruncatedInput, decompressBlock("\x50hel", out[0..5]));
    try testing.expectError(error.TruncatedInput, decompressBlock("\x44abcd\x04", out[0..12]));
    try testing.expectError(error.TruncatedInput, decompressBlock("\xF0", out[0..20]));
    try testing.expectError(error.TruncatedInput, decompressBlock("\xF0\x05abc", out[0..20]));
    try testing.expectError(error.TruncatedInput, decompressBlock("\xF0\xFF", out[0..300]));
    try testing.expectError(error.TruncatedInput, decompressBlock("\x1Fa\x01\x00", out[0..30]));
    try testing.expectError(error.TruncatedInput, decompressBlock("\x44abcd\x04\x00", out[0..12]));
    try testing.expectError(error.TruncatedInput, decompressPrepended("\x05\x00\x00\x00", out[0..5]));

    // ZeroOffset.
    try testing.expectError(error.ZeroOffset, decompressBlock("\x10a\x00\x00\x00", out[0..5]));

    // OffsetBeyondOutput: offset 2 with only one byte produced, and a match first.
    try testing.expectError(error.OffsetBeyondOutput, decompressBlock("\x10a\x02\x00\x00", out[0..5]));
    try testing.expectError(error.OffsetBeyondOutput, decompressBlock("\x00\x01\x00\x00", out[0..4]));

    // OutputOverrun: too many literals, a match past the end, an extension past the end,
    // and trailing sequences after the output is already full.
    try testing.expectError(error.OutputOverrun, decompressBlock("\x50hello", out[0..4]));
    try testing.expectError(error.OutputOverrun, decompressBlock("\x16a\x01\x00\x00", out[0..8]));
    try testing.expectError(error.OutputOverrun, decompressBlock("\x1Fa\x01\x00\xFF\x00\x00", out[0..64]));
    try testing.expectError(error.OutputOverrun, decompressBlock("\x10a\x01\x00\x00", out[0..1]));

    // SizeMismatch: the block ends early, or the prefix disagrees with the destination.
    try testing.expectError(error.SizeMismatch, decompressBlock("\x50hello", out[0..6]));
    try testing.expectError(error.SizeMismatch, decompressPrepended("\x05\x00\x00\x00\x50hello", out[0..4]));
    try testing.expectError(error.SizeMismatch, decompressPrepended("\x05\x00\x00\x00\x50hello", out[0..6]));
    try decompressPrepended("\x05\x00\x00\x00\x50hello", out[0..5]);
}

test "describe gives a message for every error" {
    const all = [_]DecodeError{
        error.MissingSizePrefix,  error.TruncatedInput, error.ZeroOffset,
        error.OffsetBeyondOutput, error.OutputOverrun,  error.SizeMismatch,
    };
    for (all) |err| try testing.expect(describe(err).len > 0);
    try testing.expectEqualStrings("match offset 0 is invalid", describe(error.ZeroOffset));
}

test "fuzz: corrupted and truncated blocks never crash the decoder" {
    const gpa = testing.allocator;
    const max_len = 2048;
    const data = try gpa.alloc(u8, max_len);
    defer gpa.free(data);
    const block = try gpa.alloc(u8, compressBound(max_len) + 64);
    defer gpa.free(block);
    const out = try gpa.alloc(u8, max_len + 64);
    defer gpa.free(out);

    for ([_]u64{ 1, 2, 3, 0xdead_beef }) |seed| {
        var prng = std.Random.DefaultPrng.init(seed);
        const random = prng.random();
        for (0..2500) |_| {
            const len = random.uintAtMost(usize, max_len);
            switch (random.uintLessThan(u8, 3)) {
                0 => fillRandom(random, data[0..len]),
                1 => fillCompressible(random, data[0..len]),
                else => for (data[0..len], 0..) |*b, i| {
                    b.* = @truncate(i % (1 + random.uintLessThan(usize, 9)));
                },
            }
            var n = compressBlock(data[0..len], block);

            // An untouched block must decode exactly.
            try decompressBlock(block[0..n], out[0..len]);
            try testing.expectEqualSlices(u8, data[0..len], out[0..len]);

            // Corrupt it: overwrite bytes, flip bits, truncate or extend with noise.
            const edits = 1 + random.uintLessThan(usize, 4);
            for (0..edits) |_| {
                switch (random.uintLessThan(u8, 4)) {
                    0 => block[random.uintLessThan(usize, n)] = random.int(u8),
                    1 => block[random.uintLessThan(usize, n)] ^= @as(u8, 1) << random.int(u3),
                    2 => n = random.uintAtMost(usize, n),
                    else => {
                        const extra = random.uintAtMost(usize, 16);
                        random.bytes(block[n..][0..extra]);
                        n += extra;
                    },
                }
                if (n == 0) break;
            }
            // Decode into the true size and into a wrong size; both must merely return.
            decompressBlock(block[0..n], out[0..len]) catch {};
            const other = random.uintAtMost(usize, out.len);
            decompressBlock(block[0..n], out[0..other]) catch {};
        }

        // Pure noise, both as a bare block and as a size-prepended payload.
        for (0..2500) |_| {
            const n = random.uintAtMost(usize, 64);
            random.bytes(block[0..n]);
            if (random.boolean()) block[0] &= 0x0F; // Vary the first literal count too.
            const other = random.uintAtMost(usize, 512);
            decompressBlock(block[0..n], out[0..other]) catch {};
            if (prependedSize(block[0..n])) |size| {
                if (size <= out.len) decompressPrepended(block[0..n], out[0..size]) catch {};
            } else |_| {}
        }
    }
}
