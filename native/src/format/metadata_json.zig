//! Embedded record metadata as compact JSON, byte-compatible with dataset-rt 0.4.8.
//!
//! Every shard record (reference section 2.5: `u64 LE json_len`, JSON, payload) embeds the
//! sample's metadata as one compact JSON object whose keys are the schema's field names in
//! byte order. The writer side (`encodeRecord`, `appendFloat`, `appendString`) reproduces the
//! reference's bytes exactly:
//!
//! * strings use serde_json escaping: `\"`, `\\`, `\b \f \n \r \t`, other control
//!   characters as `\u00XX` (lowercase hex); `/`, DEL and all non-ASCII are raw UTF-8;
//! * floats use the shortest round-trip digits (Ryu), in fixed notation when the decimal
//!   exponent e (value = d.ddd×10^e) is in -5 ≤ e ≤ 15 (with `.0` for integral values),
//!   otherwise `d[.ddd]e±X` (`1e+16`, `1e-6`); neither Python `repr` nor classic Ryu;
//! * ints are plain decimal, bools `true` / `false`.
//!
//! The reader side (`parseRecord`) is a single-pass, allocation-free (unless strings carry
//! escapes or the schema has more than 128 fields) parser of one JSON object against the
//! schema. It reproduces the reference's observable semantics, which come from serde_json
//! deserializing a map of an untagged `MetadataValue { Bool, Int(i64), Float(f64), String }`
//! and then checking it against the schema:
//!
//! * JSON errors (kind `.json`, surfaced as `RuntimeError: JSON error: ...`) always win:
//!   syntax errors, invalid UTF-8, bad escapes, lone surrogates, trailing characters,
//!   numbers that overflow f64, and values that are not bool/number/string (`null` is
//!   accepted only in float fields, see below; arrays and objects never).
//! * Then, as `ValueError`s (kind `.invalid_cache`): the number of distinct keys must equal
//!   the number of fields (`embedded metadata keys do not match schema`); then, in schema
//!   order, each field must be present (`embedded metadata field 's' is missing`) and of its
//!   kind (`embedded metadata field 'a' expected int, got string`).
//! * Number classes follow serde_json: an integer literal that fits i64 is an int
//!   (except `-0`, which serde_json reads as the float -0.0); larger integer literals and
//!   literals with a fraction or exponent are floats. So `1.0` or `1e2` in an int field and
//!   `1` in a float field are kind mismatches, exactly as in the reference.
//! * Duplicate keys: the last occurrence wins and counts once (serde_json map semantics).
//!
//! Deliberate differences from the reference (SPEC section 4, compatibility policy):
//! floats are parsed correctly rounded (`std.fmt.parseFloat`), so every written float reads
//! back bit for bit (the reference reads `90.33333333333333` as `90.33333333333331`); and a
//! JSON `null` in a float field (how the reference stores NaN and ±inf) parses as
//! `Value.null` instead of failing, so the caller can substitute the `metadata.arrow` value.

const std = @import("std");
const builtin = @import("builtin");
const schema = @import("schema.zig");

const Field = schema.Field;
const Kind = schema.Kind;
const Value = schema.Value;

// ---------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------

/// Appends `{"k":v,...}` for `fields` (sorted, checked by the caller) and `values` (same
/// length; each value's tag matches its field's kind). Floats must be finite (the writer
/// rejects NaN and ±inf before encoding); a non-finite float or a `.null` value is written
/// as `null`, as the reference does.
pub fn encodeRecord(
    gpa: std.mem.Allocator,
    out: *std.ArrayList(u8),
    fields: []const Field,
    values: []const Value,
) error{OutOfMemory}!void {
    std.debug.assert(fields.len == values.len);
    // One reservation for the whole record, then plain stores.
    var bound: usize = 2;
    for (fields, values) |field, value| {
        bound += stringBound(field.name) + 2 + switch (value) {
            .bool => 5,
            .int => 20,
            .float => max_float_len,
            .string => |text| stringBound(text),
            .null => 4,
        };
    }
    try out.ensureUnusedCapacity(gpa, bound);
    const dst = out.unusedCapacitySlice();
    dst[0] = '{';
    var o: usize = 1;
    for (fields, values, 0..) |field, value, index| {
        if (index != 0) {
            dst[o] = ',';
            o += 1;
        }
        o += writeString(dst[o..], field.name);
        dst[o] = ':';
        o += 1;
        switch (value) {
            .bool => |b| {
                const text = if (b) "true" else "false";
                @memcpy(dst[o..][0..text.len], text);
                o += text.len;
            },
            .int => |v| o += writeInt(dst[o..][0..20], v),
            .float => |v| o += formatFloat(dst[o..][0..max_float_len], v).len,
            .string => |text| o += writeString(dst[o..], text),
            .null => {
                @memcpy(dst[o..][0..4], "null");
                o += 4;
            },
        }
    }
    dst[o] = '}';
    out.items.len += o + 1;
}

/// Appends `value` in the reference's float format (see the module documentation).
/// NaN and ±inf are written as `null`.
pub fn appendFloat(gpa: std.mem.Allocator, out: *std.ArrayList(u8), value: f64) error{OutOfMemory}!void {
    var buf: [max_float_len]u8 = undefined;
    try out.appendSlice(gpa, formatFloat(&buf, value));
}

/// Longest output of `formatFloat` is 24 bytes (`-2.2250738585072014e-308`).
pub const max_float_len = 32;

/// Formats `value` in the reference's float format into `buf` and returns the used part.
pub fn formatFloat(buf: *[max_float_len]u8, value: f64) []const u8 {
    if (!std.math.isFinite(value)) {
        @memcpy(buf[0..4], "null");
        return buf[0..4];
    }
    const bits: u64 = @bitCast(value);
    const negative = (bits >> 63) != 0;
    if (value == 0) {
        const text = if (negative) "-0.0" else "0.0";
        @memcpy(buf[0..text.len], text);
        return buf[0..text.len];
    }

    const tables = if (builtin.mode == .ReleaseSmall)
        &std.fmt.float.Backend64_TablesSmall
    else
        &std.fmt.float.Backend64_TablesFull;
    const decimal = std.fmt.float.binaryToDecimal(u64, bits, 52, 11, false, tables);
    var mantissa: u64 = decimal.mantissa;
    var exponent: i32 = decimal.exponent;
    while (mantissa % 10 == 0) {
        mantissa /= 10;
        exponent += 1;
    }

    // Shortest digits (at most 17), most significant first, two at a time.
    var digit_buf: [20]u8 = undefined;
    var start: usize = digit_buf.len;
    while (mantissa >= 100) {
        start -= 2;
        digit_buf[start..][0..2].* = std.fmt.digits2(@intCast(mantissa % 100));
        mantissa /= 100;
    }
    if (mantissa >= 10) {
        start -= 2;
        digit_buf[start..][0..2].* = std.fmt.digits2(@intCast(mantissa));
    } else {
        start -= 1;
        digit_buf[start] = '0' + @as(u8, @intCast(mantissa));
    }
    const digits = digit_buf[start..];
    const n: i32 = @intCast(digits.len);
    // Scientific exponent: value = d.ddd × 10^sci.
    const sci: i32 = exponent + n - 1;

    var pos: usize = 0;
    if (negative) {
        buf[0] = '-';
        pos = 1;
    }
    if (sci >= -5 and sci <= 15) {
        if (exponent >= 0) {
            // Integral: digits, trailing zeros, ".0".
            @memcpy(buf[pos..][0..digits.len], digits);
            pos += digits.len;
            const zeros: usize = @intCast(exponent);
            @memset(buf[pos..][0..zeros], '0');
            pos += zeros;
            @memcpy(buf[pos..][0..2], ".0");
            pos += 2;
        } else if (sci >= 0) {
            const int_len: usize = @intCast(sci + 1);
            @memcpy(buf[pos..][0..int_len], digits[0..int_len]);
            pos += int_len;
            buf[pos] = '.';
            pos += 1;
            const frac = digits[int_len..];
            @memcpy(buf[pos..][0..frac.len], frac);
            pos += frac.len;
        } else {
            @memcpy(buf[pos..][0..2], "0.");
            pos += 2;
            const zeros: usize = @intCast(-sci - 1);
            @memset(buf[pos..][0..zeros], '0');
            pos += zeros;
            @memcpy(buf[pos..][0..digits.len], digits);
            pos += digits.len;
        }
    } else {
        buf[pos] = digits[0];
        pos += 1;
        if (digits.len > 1) {
            buf[pos] = '.';
            pos += 1;
            @memcpy(buf[pos..][0 .. digits.len - 1], digits[1..]);
            pos += digits.len - 1;
        }
        buf[pos] = 'e';
        buf[pos + 1] = if (sci < 0) '-' else '+';
        pos += 2;
        var magnitude: u32 = @abs(sci);
        var exp_buf: [4]u8 = undefined;
        var exp_start: usize = exp_buf.len;
        while (true) {
            exp_start -= 1;
            exp_buf[exp_start] = '0' + @as(u8, @intCast(magnitude % 10));
            magnitude /= 10;
            if (magnitude == 0) break;
        }
        const exp_digits = exp_buf[exp_start..];
        @memcpy(buf[pos..][0..exp_digits.len], exp_digits);
        pos += exp_digits.len;
    }
    return buf[0..pos];
}

/// Appends `v` in plain decimal.
pub fn appendInt(gpa: std.mem.Allocator, out: *std.ArrayList(u8), v: i64) error{OutOfMemory}!void {
    try out.ensureUnusedCapacity(gpa, 20);
    out.items.len += writeInt(out.unusedCapacitySlice()[0..20], v);
}

/// Writes `v` in plain decimal at the start of `dst`; returns the length.
fn writeInt(dst: *[20]u8, v: i64) usize {
    var buf: [20]u8 = undefined;
    var pos: usize = buf.len;
    var magnitude: u64 = @abs(v);
    while (magnitude >= 100) {
        pos -= 2;
        buf[pos..][0..2].* = std.fmt.digits2(@intCast(magnitude % 100));
        magnitude /= 100;
    }
    if (magnitude >= 10) {
        pos -= 2;
        buf[pos..][0..2].* = std.fmt.digits2(@intCast(magnitude));
    } else {
        pos -= 1;
        buf[pos] = '0' + @as(u8, @intCast(magnitude));
    }
    if (v < 0) {
        pos -= 1;
        buf[pos] = '-';
    }
    const text = buf[pos..];
    @memcpy(dst[0..text.len], text);
    return text.len;
}

/// Per byte: 0 = written raw, otherwise the escape letter (`u` = `\u00XX`).
const escape_table: [256]u8 = blk: {
    var table = [_]u8{0} ** 256;
    for (0..0x20) |c| table[c] = 'u';
    table['\x08'] = 'b';
    table['\x0c'] = 'f';
    table['\n'] = 'n';
    table['\r'] = 'r';
    table['\t'] = 't';
    table['"'] = '"';
    table['\\'] = '\\';
    break :blk table;
};

/// Appends `s` (valid UTF-8) as a JSON string with serde_json escaping, quotes included.
pub fn appendString(gpa: std.mem.Allocator, out: *std.ArrayList(u8), s: []const u8) error{OutOfMemory}!void {
    try out.ensureUnusedCapacity(gpa, stringBound(s));
    out.items.len += writeString(out.unusedCapacitySlice(), s);
}

/// Room `writeString` may need for `s`: a cheap worst case for short strings, the exact
/// size for long ones (so a long string never reserves six times its length).
fn stringBound(s: []const u8) usize {
    if (s.len <= 4096) return 6 * s.len + 2;
    var n: usize = s.len + 2;
    for (s) |c| {
        n += switch (escape_table[c]) {
            0 => 0,
            'u' => 5,
            else => 1,
        };
    }
    return n;
}

/// End of the run of bytes from `start` on that are written raw.
fn plainRunEnd(s: []const u8, start: usize) usize {
    var i = start;
    const V = @Vector(16, u8);
    while (i + 16 <= s.len) {
        const v: V = s[i..][0..16].*;
        const control: u16 = @bitCast(v < @as(V, @splat(0x20)));
        const quote: u16 = @bitCast(v == @as(V, @splat('"')));
        const backslash: u16 = @bitCast(v == @as(V, @splat('\\')));
        const special = control | quote | backslash;
        if (special != 0) return i + @ctz(special);
        i += 16;
    }
    while (i < s.len and escape_table[s[i]] == 0) i += 1;
    return i;
}

/// Writes `s` quoted and escaped into `dst` (at least `stringBound(s)` bytes); returns
/// the length written.
fn writeString(dst: []u8, s: []const u8) usize {
    dst[0] = '"';
    var o: usize = 1;
    var i: usize = 0;
    while (true) {
        const run_end = plainRunEnd(s, i);
        const run = s[i..run_end];
        @memcpy(dst[o..][0..run.len], run);
        o += run.len;
        i = run_end;
        if (i >= s.len) break;
        const c = s[i];
        i += 1;
        const esc = escape_table[c];
        if (esc == 'u') {
            const hex = "0123456789abcdef";
            dst[o..][0..6].* = .{ '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };
            o += 6;
        } else {
            dst[o..][0..2].* = .{ '\\', esc };
            o += 2;
        }
    }
    dst[o] = '"';
    return o + 1;
}

// ---------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------

/// `json` surfaces as `RuntimeError: JSON error: <message>`; `invalid_cache` as
/// `ValueError: <message>`.
pub const ErrorKind = enum { json, invalid_cache };

/// Error detail of a failed `parseRecord`. The message has no `JSON error: ` prefix and is
/// always valid UTF-8 (truncated at a character boundary when longer than the buffer).
pub const Diagnostic = struct {
    kind: ErrorKind = .json,
    buf: [256]u8 = undefined,
    len: usize = 0,

    pub fn message(self: *const Diagnostic) []const u8 {
        return self.buf[0..self.len];
    }

    fn set(self: *Diagnostic, kind: ErrorKind, comptime fmt: []const u8, args: anytype) void {
        self.kind = kind;
        var w: std.Io.Writer = .fixed(&self.buf);
        w.print(fmt, args) catch {};
        self.len = utf8Prefix(self.buf[0..w.end]);
    }
};

/// Length of the longest prefix of `bytes` that does not end inside a UTF-8 sequence.
fn utf8Prefix(bytes: []const u8) usize {
    var lead = bytes.len;
    var back: usize = 0;
    while (lead > 0 and back < 4) {
        lead -= 1;
        back += 1;
        const c = bytes[lead];
        if (c & 0xC0 != 0x80) {
            const need: usize = if (c < 0x80) 1 else if (c >= 0xF0) 4 else if (c >= 0xE0) 3 else 2;
            return if (need <= bytes.len - lead) bytes.len else lead;
        }
    }
    return bytes.len;
}

pub const ParseError = error{ Invalid, OutOfMemory };

/// Parses one embedded JSON object against the schema. `values_out.len == fields.len`;
/// `values_out[i]` receives field i's value. String values without escapes are slices of
/// `json`; escaped strings are decoded into `scratch` (appended to, never cleared here) and
/// sliced from it, so they stay valid until `scratch` is next modified. A JSON `null` is
/// accepted only in float fields (giving `Value.null`). Whitespace between tokens and any
/// key order are accepted. On error `diag` describes it and `values_out` is unspecified.
pub fn parseRecord(
    json: []const u8,
    fields: []const Field,
    values_out: []Value,
    scratch: *std.ArrayList(u8),
    gpa: std.mem.Allocator,
    diag: *Diagnostic,
) ParseError!void {
    std.debug.assert(values_out.len == fields.len);

    // Small on the stack: safe builds fill `undefined` memory, and this runs per record
    // (a 1024-entry buffer cost ~200 instructions of a ~1,150-instruction get_item). A
    // wider schema parses far longer than its one allocation takes.
    var state_buf: [128]FieldState = undefined;
    const heap_state = fields.len > state_buf.len;
    const state: []FieldState = if (heap_state) try gpa.alloc(FieldState, fields.len) else state_buf[0..fields.len];
    defer if (heap_state) gpa.free(state);
    @memset(state, .unset);

    var p: Parser = .{ .json = json, .diag = diag };
    try p.begin();

    var known: usize = 0; // distinct schema fields seen
    var unknown: usize = 0; // unknown keys, with multiplicity
    var cursor: usize = 0; // expected index of the next key (keys normally come sorted)
    var escaped_total: usize = 0; // upper bound of the decoded size of escaped values
    while (try p.next()) |entry| {
        const index = blk: {
            if (!entry.key.escaped) {
                // Keys normally come in schema order: the expected one first, inline.
                if (cursor < fields.len and eqlShort(fields[cursor].name, entry.key.raw)) break :blk cursor;
                break :blk findField(fields, cursor, entry.key.raw);
            }
            // Decode the key into scratch's spare capacity (scratch.items is unchanged).
            try scratch.ensureUnusedCapacity(gpa, entry.key.raw.len);
            const n = decodeString(entry.key.raw, scratch.unusedCapacitySlice());
            break :blk findField(fields, cursor, scratch.unusedCapacitySlice()[0..n]);
        };
        const k = index orelse {
            if (entry.value == .null) return p.untaggedError(entry.value_end);
            unknown += 1;
            continue;
        };
        cursor = k + 1;
        if (state[k] == .unset) known += 1;
        if (entry.value == .null) {
            if (fields[k].kind != .float) return p.untaggedError(entry.value_end);
            values_out[k] = .null;
            state[k] = .ok;
            continue;
        }
        const got = entry.value.kind();
        if (got != fields[k].kind) {
            state[k] = FieldState.mismatch(got);
            continue;
        }
        state[k] = .ok;
        values_out[k] = switch (entry.value) {
            .bool => |b| .{ .bool = b },
            .int => |v| .{ .int = v },
            .float => |v| .{ .float = v },
            .string => |s| blk: {
                if (s.escaped) {
                    state[k] = .pending;
                    escaped_total += s.raw.len;
                }
                break :blk .{ .string = s.raw };
            },
            .null => unreachable,
        };
    }

    // Schema checks, in the reference's order: key count, then each field in schema order.
    if (known != fields.len or unknown != 0) {
        const distinct = known + if (unknown > 1) try countDistinctUnknown(json, fields, gpa) else unknown;
        if (distinct != fields.len) {
            diag.set(.invalid_cache, "embedded metadata keys do not match schema", .{});
            return error.Invalid;
        }
    }
    for (fields, state) |field, st| switch (st) {
        .ok, .pending => {},
        .unset => {
            diag.set(.invalid_cache, "embedded metadata field '{s}' is missing", .{field.name});
            return error.Invalid;
        },
        .got_bool, .got_int, .got_float, .got_string => {
            diag.set(.invalid_cache, "embedded metadata field '{s}' expected {s}, got {s}", .{
                field.name, field.kind.name(), st.gotName(),
            });
            return error.Invalid;
        },
    };

    // Decode escaped strings only now: one reservation, so no slice handed out is moved.
    if (escaped_total != 0) {
        try scratch.ensureUnusedCapacity(gpa, escaped_total);
        for (state, values_out) |st, *value| {
            if (st != .pending) continue;
            const start = scratch.items.len;
            const n = decodeString(value.string, scratch.unusedCapacitySlice());
            scratch.items.len += n;
            value.* = .{ .string = scratch.items[start..][0..n] };
        }
    }
}

const FieldState = enum(u8) {
    unset,
    ok,
    /// `.string` holds the raw (escaped) slice of `json`; decoded after the pass.
    pending,
    got_bool,
    got_int,
    got_float,
    got_string,

    fn mismatch(got: Kind) FieldState {
        return switch (got) {
            .bool => .got_bool,
            .int => .got_int,
            .float => .got_float,
            .string => .got_string,
        };
    }

    fn gotName(st: FieldState) []const u8 {
        return switch (st) {
            .got_bool => "bool",
            .got_int => "int",
            .got_float => "float",
            .got_string => "string",
            else => unreachable,
        };
    }
};

/// Index of the field named `key`: `cursor` first (keys normally arrive in schema order),
/// then a binary search of the sorted schema.
fn findField(fields: []const Field, cursor: usize, key: []const u8) ?usize {
    if (cursor < fields.len and eqlShort(fields[cursor].name, key)) return cursor;
    var lo: usize = 0;
    var hi: usize = fields.len;
    while (lo < hi) {
        const mid = lo + (hi - lo) / 2;
        switch (std.mem.order(u8, fields[mid].name, key)) {
            .lt => lo = mid + 1,
            .gt => hi = mid,
            .eq => return mid,
        }
    }
    // A manifest may list its schema unsorted (hand-edited); the reference still finds
    // every key, so fall back to a linear scan before calling a key unknown.
    for (fields, 0..) |f, i| {
        if (eqlShort(f.name, key)) return i;
    }
    return null;
}

/// Byte equality tuned for short keys (std.mem.eql sets up SIMD first): keys of 4 to 16
/// bytes compare as two overlapping words (the first and the last 4 or 8 bytes), others
/// byte by byte.
inline fn eqlShort(a: []const u8, b: []const u8) bool {
    if (a.len != b.len) return false;
    const n = a.len;
    if (n >= 8 and n <= 16) {
        return std.mem.readInt(u64, a[0..8], .little) == std.mem.readInt(u64, b[0..8], .little) and
            std.mem.readInt(u64, a[n - 8 ..][0..8], .little) == std.mem.readInt(u64, b[n - 8 ..][0..8], .little);
    }
    if (n >= 4 and n < 8) {
        return std.mem.readInt(u32, a[0..4], .little) == std.mem.readInt(u32, b[0..4], .little) and
            std.mem.readInt(u32, a[n - 4 ..][0..4], .little) == std.mem.readInt(u32, b[n - 4 ..][0..4], .little);
    }
    for (a, b) |x, y| {
        if (x != y) return false;
    }
    return true;
}

/// Error path only: the number of distinct keys of `json` (known to be valid) that are not
/// schema fields, comparing decoded keys like serde_json's map does.
fn countDistinctUnknown(json: []const u8, fields: []const Field, gpa: std.mem.Allocator) error{OutOfMemory}!usize {
    var diag: Diagnostic = .{};
    var p: Parser = .{ .json = json, .diag = &diag };
    var bytes: std.ArrayList(u8) = .empty;
    defer bytes.deinit(gpa);
    var spans: std.ArrayList([2]usize) = .empty;
    defer spans.deinit(gpa);
    p.begin() catch unreachable;
    while (p.next() catch unreachable) |entry| {
        const start = bytes.items.len;
        try bytes.ensureUnusedCapacity(gpa, entry.key.raw.len);
        const free = bytes.unusedCapacitySlice();
        const n = if (entry.key.escaped) decodeString(entry.key.raw, free) else blk: {
            @memcpy(free[0..entry.key.raw.len], entry.key.raw);
            break :blk entry.key.raw.len;
        };
        const key = free[0..n];
        if (findField(fields, 0, key) != null) continue;
        bytes.items.len += n;
        try spans.append(gpa, .{ start, n });
    }
    const keys = try gpa.alloc([]const u8, spans.items.len);
    defer gpa.free(keys);
    for (keys, spans.items) |*key, span| key.* = bytes.items[span[0]..][0..span[1]];
    std.mem.sortUnstable([]const u8, keys, {}, struct {
        fn lessThan(_: void, a: []const u8, b: []const u8) bool {
            return std.mem.lessThan(u8, a, b);
        }
    }.lessThan);
    var distinct: usize = 0;
    for (keys, 0..) |key, i| {
        if (i == 0 or !std.mem.eql(u8, keys[i - 1], key)) distinct += 1;
    }
    return distinct;
}

const Str = struct {
    /// Between the quotes, escapes not decoded.
    raw: []const u8,
    escaped: bool,
};

const Token = union(enum) {
    bool: bool,
    int: i64,
    float: f64,
    string: Str,
    null,

    fn kind(t: Token) Kind {
        return switch (t) {
            .bool => .bool,
            .int => .int,
            .float => .float,
            .string => .string,
            .null => unreachable,
        };
    }
};

const Entry = struct {
    key: Str,
    value: Token,
    /// Index just past the value.
    value_end: usize,
};

/// Sets a `.json` diagnostic for the offending byte `json[index]` (end of input when
/// `index >= json.len`), with a serde_json-style line and column.
noinline fn reportJson(diag: *Diagnostic, json: []const u8, index: usize, msg: []const u8) void {
    @branchHint(.cold);
    const end = @min(index, json.len);
    const line_start = if (std.mem.lastIndexOfScalar(u8, json[0..end], '\n')) |nl| nl + 1 else 0;
    const line = 1 + std.mem.count(u8, json[0..end], "\n");
    const column = if (index < json.len) index + 1 - line_start else json.len - line_start;
    diag.set(.json, "{s} at line {d} column {d}", .{ msg, line, column });
}

/// Tokenizer of one JSON object whose values are scalars. Every read is bounds-checked
/// against `json.len`; errors set `diag` (kind `.json`) with serde_json-like wording and a
/// serde_json-style position (line, and column = 1-based byte index of the offending byte
/// within its line, or the line's length at end of input).
const Parser = struct {
    json: []const u8,
    i: usize = 0,
    done: bool = false,
    diag: *Diagnostic,

    /// Inline so that the parser's address never escapes (keeps `i` in a register); the
    /// cold work happens in `reportJson`.
    inline fn fail(p: *const Parser, index: usize, comptime msg: []const u8) error{Invalid} {
        reportJson(p.diag, p.json, index, msg);
        return error.Invalid;
    }

    fn untaggedError(p: *Parser, value_end: usize) error{Invalid} {
        return p.fail(value_end - 1, "data did not match any variant of untagged enum MetadataValue");
    }

    inline fn skipWs(p: *Parser) void {
        // Compact JSON (as written) has none: one comparison, as every JSON whitespace
        // byte is below '!'.
        if (p.i < p.json.len and p.json[p.i] > ' ') return;
        while (p.i < p.json.len) : (p.i += 1) {
            switch (p.json[p.i]) {
                ' ', '\t', '\n', '\r' => {},
                else => return,
            }
        }
    }

    /// Consumes `{` and the whitespace after it.
    fn begin(p: *Parser) error{Invalid}!void {
        p.skipWs();
        if (p.i >= p.json.len) return p.fail(p.i, "EOF while parsing a value");
        switch (p.json[p.i]) {
            '{' => {},
            '[' => return p.fail(p.i, "invalid type: sequence, expected a map"),
            '"' => return p.fail(p.i, "invalid type: string, expected a map"),
            't', 'f' => return p.fail(p.i, "invalid type: boolean, expected a map"),
            'n' => return p.fail(p.i, "invalid type: null, expected a map"),
            '-', '0'...'9' => return p.fail(p.i, "invalid type: number, expected a map"),
            else => return p.fail(p.i, "expected value"),
        }
        p.i += 1;
        p.skipWs();
        if (p.i < p.json.len and p.json[p.i] == '}') {
            p.i += 1;
            try p.finish();
        }
    }

    /// After the closing brace: only whitespace may follow.
    fn finish(p: *Parser) error{Invalid}!void {
        p.done = true;
        p.skipWs();
        if (p.i < p.json.len) return p.fail(p.i, "trailing characters");
    }

    /// The next key/value pair, or null after the closing brace.
    inline fn next(p: *Parser) error{Invalid}!?Entry {
        if (p.done) return null;
        if (p.i >= p.json.len) return p.fail(p.i, "EOF while parsing an object");
        if (p.json[p.i] != '"') return p.fail(p.i, "key must be a string");
        const key = try p.string();
        p.skipWs();
        if (p.i >= p.json.len) return p.fail(p.i, "EOF while parsing an object");
        if (p.json[p.i] != ':') return p.fail(p.i, "expected `:`");
        p.i += 1;
        p.skipWs();
        const value = try p.scalar();
        const value_end = p.i;
        p.skipWs();
        if (p.i >= p.json.len) return p.fail(p.i, "EOF while parsing an object");
        switch (p.json[p.i]) {
            ',' => {
                p.i += 1;
                p.skipWs();
                if (p.i < p.json.len and p.json[p.i] == '}') return p.fail(p.i, "trailing comma");
            },
            '}' => {
                p.i += 1;
                try p.finish();
            },
            else => return p.fail(p.i, "expected `,` or `}`"),
        }
        return .{ .key = key, .value = value, .value_end = value_end };
    }

    inline fn scalar(p: *Parser) error{Invalid}!Token {
        if (p.i >= p.json.len) return p.fail(p.i, "EOF while parsing a value");
        switch (p.json[p.i]) {
            '"' => return .{ .string = try p.string() },
            't' => {
                try p.literal("true");
                return .{ .bool = true };
            },
            'f' => {
                try p.literal("false");
                return .{ .bool = false };
            },
            'n' => {
                try p.literal("null");
                return .null;
            },
            '-', '0'...'9' => return p.number(),
            '[', '{' => return p.fail(p.i, "data did not match any variant of untagged enum MetadataValue"),
            else => return p.fail(p.i, "expected value"),
        }
    }

    fn literal(p: *Parser, comptime word: []const u8) error{Invalid}!void {
        inline for (word) |c| {
            if (p.i >= p.json.len) return p.fail(p.i, "EOF while parsing a value");
            if (p.json[p.i] != c) return p.fail(p.i, "expected ident");
            p.i += 1;
        }
    }

    fn isDigit(c: u8) bool {
        return c -% '0' < 10;
    }

    inline fn skipDigits(p: *Parser) void {
        // Eight digits at a time while they last.
        while (p.i + 8 <= p.json.len) {
            const v = std.mem.readInt(u64, p.json[p.i..][0..8], .little);
            const all_digits = (v & 0xF0F0F0F0F0F0F0F0) == 0x3030303030303030 and
                ((v +% 0x0606060606060606) & 0xF0F0F0F0F0F0F0F0) == 0x3030303030303030;
            if (!all_digits) break;
            p.i += 8;
        }
        while (p.i < p.json.len and isDigit(p.json[p.i])) p.i += 1;
    }

    /// JSON number with serde_json's classes: an integer literal that fits i64 (and is not
    /// `-0`) is an int, anything else a float; a float that overflows f64 is an error.
    inline fn number(p: *Parser) error{Invalid}!Token {
        const json = p.json;
        const start = p.i;
        const negative = json[p.i] == '-';
        if (negative) p.i += 1;
        if (p.i >= json.len) return p.fail(p.i, "EOF while parsing a value");
        var magnitude: u64 = 0;
        var overflow = false;
        const first = json[p.i];
        if (first == '0') {
            p.i += 1;
            if (p.i < json.len and isDigit(json[p.i])) return p.fail(p.i, "invalid number");
        } else if (isDigit(first)) {
            while (p.i < json.len and isDigit(json[p.i])) : (p.i += 1) {
                const d = json[p.i] - '0';
                const mul = @mulWithOverflow(magnitude, 10);
                const add = @addWithOverflow(mul[0], d);
                if (mul[1] != 0 or add[1] != 0) overflow = true;
                magnitude = add[0];
            }
        } else return p.fail(p.i, "invalid number");

        var is_float = overflow;
        if (p.i < json.len and json[p.i] == '.') {
            is_float = true;
            p.i += 1;
            if (p.i >= json.len) return p.fail(p.i, "EOF while parsing a value");
            if (!isDigit(json[p.i])) return p.fail(p.i, "invalid number");
            p.skipDigits();
        }
        if (p.i < json.len and (json[p.i] == 'e' or json[p.i] == 'E')) {
            is_float = true;
            p.i += 1;
            if (p.i < json.len and (json[p.i] == '+' or json[p.i] == '-')) p.i += 1;
            if (p.i >= json.len) return p.fail(p.i, "EOF while parsing a value");
            if (!isDigit(json[p.i])) return p.fail(p.i, "invalid number");
            p.skipDigits();
        }
        if (!is_float) {
            if (!negative) {
                if (magnitude <= std.math.maxInt(i64)) return .{ .int = @intCast(magnitude) };
            } else if (magnitude != 0 and magnitude <= @as(u64, 1) << 63) {
                return .{ .int = @intCast(-@as(i128, magnitude)) };
            }
        }
        const value = std.fmt.parseFloat(f64, json[start..p.i]) catch
            return p.fail(p.i - 1, "invalid number");
        if (!std.math.isFinite(value)) return p.fail(p.i - 1, "number out of range");
        return .{ .float = value };
    }

    /// A string starting at the opening quote: validated (escapes, surrogates, control
    /// characters, UTF-8) but not decoded.
    inline fn string(p: *Parser) error{Invalid}!Str {
        const json = p.json;
        p.i += 1;
        const start = p.i;
        var escaped = false;
        var bad_utf8 = false;
        while (true) {
            // Jump over plain ASCII straight to the next byte that needs a look.
            p.i = nextSpecial(json, p.i);
            if (p.i >= json.len) return p.fail(p.i, "EOF while parsing a string");
            const c = json[p.i];
            if (c == '"') break;
            if (c == '\\') {
                escaped = true;
                p.i += 1;
                if (p.i >= json.len) return p.fail(p.i, "EOF while parsing a string");
                switch (json[p.i]) {
                    '"', '\\', '/', 'b', 'f', 'n', 'r', 't' => p.i += 1,
                    'u' => {
                        p.i += 1;
                        try p.unicodeEscape();
                    },
                    else => return p.fail(p.i, "invalid escape"),
                }
            } else if (c < 0x20) {
                return p.fail(p.i, "control character (\\u0000-\\u001F) found while parsing a string");
            } else if (c < 0x80) {
                p.i += 1;
            } else if (utf8SequenceLength(json, p.i)) |n| {
                p.i += n;
            } else {
                // Like serde_json, report invalid UTF-8 at the closing quote.
                bad_utf8 = true;
                p.i += 1;
            }
        }
        if (bad_utf8) return p.fail(p.i, "invalid unicode code point");
        const raw = json[start..p.i];
        p.i += 1;
        return .{ .raw = raw, .escaped = escaped };
    }

    /// After `\u`: four hex digits, and for a high surrogate the `\uDC00`-`\uDFFF` partner.
    fn unicodeEscape(p: *Parser) error{Invalid}!void {
        const first = try p.hex4();
        if (first >= 0xDC00 and first <= 0xDFFF) return p.fail(p.i - 1, "lone leading surrogate in hex escape");
        if (first < 0xD800 or first > 0xDBFF) return;
        if (p.i >= p.json.len) return p.fail(p.i, "EOF while parsing a string");
        if (p.json[p.i] != '\\') return p.fail(p.i, "unexpected end of hex escape");
        p.i += 1;
        if (p.i >= p.json.len) return p.fail(p.i, "EOF while parsing a string");
        if (p.json[p.i] != 'u') return p.fail(p.i, "unexpected end of hex escape");
        p.i += 1;
        const second = try p.hex4();
        if (second < 0xDC00 or second > 0xDFFF) return p.fail(p.i - 1, "lone leading surrogate in hex escape");
    }

    /// Four hex digits; like serde_json, all four are read before one is rejected.
    fn hex4(p: *Parser) error{Invalid}!u16 {
        if (p.json.len - p.i < 4) return p.fail(p.json.len, "EOF while parsing a string");
        var v: u16 = 0;
        for (p.json[p.i..][0..4]) |c| {
            const d = hexValue(c) orelse return p.fail(p.i + 3, "invalid escape");
            v = (v << 4) | d;
        }
        p.i += 4;
        return v;
    }
};

/// Bytes a string scan must look at: a quote, a backslash, a control character or
/// non-ASCII (negative as `i8`); one bit per byte of `v`.
inline fn specialMask(v: @Vector(16, u8)) u16 {
    const signed: @Vector(16, i8) = @bitCast(v);
    const control: u16 = @bitCast(signed < @as(@Vector(16, i8), @splat(0x20)));
    const quote: u16 = @bitCast(v == @as(@Vector(16, u8), @splat('"')));
    const backslash: u16 = @bitCast(v == @as(@Vector(16, u8), @splat('\\')));
    return control | quote | backslash;
}

/// Index of the first byte of `json` at or after `start` that `specialMask` flags, or
/// `json.len` when there is none. 16 bytes at a time; the tail (records' metadata is
/// short, so most strings end within 16 bytes of the end) is looked at in one step too,
/// through the last 16 bytes of `json` or, when `json` is shorter, a padded copy.
inline fn nextSpecial(json: []const u8, start: usize) usize {
    var at = start;
    while (at + 16 <= json.len) : (at += 16) {
        const special = specialMask(json[at..][0..16].*);
        if (special != 0) return at + @ctz(special);
    }
    if (at >= json.len) return json.len;
    const special: u16 = if (json.len >= 16) blk: {
        const base = json.len - 16;
        break :blk specialMask(json[base..][0..16].*) >> @intCast(at - base);
    } else blk: {
        var tail: [16]u8 = @splat('a');
        @memcpy(tail[0 .. json.len - at], json[at..]);
        break :blk specialMask(tail);
    };
    return if (special != 0) at + @ctz(special) else json.len;
}

fn hexValue(c: u8) ?u16 {
    return switch (c) {
        '0'...'9' => c - '0',
        'a'...'f' => c - 'a' + 10,
        'A'...'F' => c - 'A' + 10,
        else => null,
    };
}

/// Length of the well-formed UTF-8 sequence starting at `s[i]` (a byte >= 0x80), or null
/// (overlong forms, surrogates, > U+10FFFF, truncated sequences: what Rust's `str` rejects).
fn utf8SequenceLength(s: []const u8, i: usize) ?usize {
    const c = s[i];
    const rest = s[i + 1 ..];
    const cont = struct {
        fn ok(b: u8) bool {
            return b & 0xC0 == 0x80;
        }
    }.ok;
    if (c < 0xC2) return null;
    if (c < 0xE0) {
        if (rest.len < 1 or !cont(rest[0])) return null;
        return 2;
    }
    if (c < 0xF0) {
        if (rest.len < 2) return null;
        const lo: u8 = if (c == 0xE0) 0xA0 else 0x80;
        const hi: u8 = if (c == 0xED) 0x9F else 0xBF;
        if (rest[0] < lo or rest[0] > hi or !cont(rest[1])) return null;
        return 3;
    }
    if (c < 0xF5) {
        if (rest.len < 3) return null;
        const lo: u8 = if (c == 0xF0) 0x90 else 0x80;
        const hi: u8 = if (c == 0xF4) 0x8F else 0xBF;
        if (rest[0] < lo or rest[0] > hi or !cont(rest[1]) or !cont(rest[2])) return null;
        return 4;
    }
    return null;
}

/// Decodes the validated string body `raw` into `out` (at least `raw.len` bytes; decoding
/// never grows) and returns the decoded length.
fn decodeString(raw: []const u8, out: []u8) usize {
    var i: usize = 0;
    var o: usize = 0;
    while (i < raw.len) {
        const run_end = std.mem.indexOfScalarPos(u8, raw, i, '\\') orelse raw.len;
        const run = raw[i..run_end];
        @memcpy(out[o..][0..run.len], run);
        o += run.len;
        i = run_end;
        if (i >= raw.len) break;
        const e = raw[i + 1];
        i += 2;
        const simple: u8 = switch (e) {
            'b' => '\x08',
            'f' => '\x0c',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => 0,
            else => e, // '"', '\\', '/'
        };
        if (e != 'u') {
            out[o] = simple;
            o += 1;
            continue;
        }
        var cp: u21 = hex4Unchecked(raw[i..][0..4]);
        i += 4;
        if (cp >= 0xD800 and cp <= 0xDBFF) {
            const low: u21 = hex4Unchecked(raw[i + 2 ..][0..4]);
            i += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        o += encodeUtf8(cp, out[o..]);
    }
    return o;
}

fn hex4Unchecked(digits: *const [4]u8) u21 {
    var v: u21 = 0;
    for (digits) |c| v = (v << 4) | (hexValue(c) orelse unreachable);
    return v;
}

fn encodeUtf8(cp: u21, out: []u8) usize {
    if (cp < 0x80) {
        out[0] = @intCast(cp);
        return 1;
    }
    if (cp < 0x800) {
        out[0] = @intCast(0xC0 | (cp >> 6));
        out[1] = @intCast(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = @intCast(0xE0 | (cp >> 12));
        out[1] = @intCast(0x80 | ((cp >> 6) & 0x3F));
        out[2] = @intCast(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = @intCast(0xF0 | (cp >> 18));
    out[1] = @intCast(0x80 | ((cp >> 12) & 0x3F));
    out[2] = @intCast(0x80 | ((cp >> 6) & 0x3F));
    out[3] = @intCast(0x80 | (cp & 0x3F));
    return 4;
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

const testing = std.testing;

fn expectFloatFormat(expected: []const u8, value: f64) !void {
    var buf: [max_float_len]u8 = undefined;
    try testing.expectEqualStrings(expected, formatFloat(&buf, value));
    // The text parses back to the same bits.
    const back = try std.fmt.parseFloat(f64, expected);
    try testing.expectEqual(@as(u64, @bitCast(value)), @as(u64, @bitCast(back)));
}

test "float format: every example of reference section 2.5" {
    try expectFloatFormat("0.0", 0.0);
    try expectFloatFormat("-0.0", -0.0);
    try expectFloatFormat("0.1", 0.1);
    try expectFloatFormat("100.0", 100.0);
    try expectFloatFormat("1000000000000000.0", 1e15);
    try expectFloatFormat("9999000000000000.0", 9999000000000000.0);
    try expectFloatFormat("1e+16", 1e16);
    try expectFloatFormat("1.2345e+16", 1.2345e16);
    try expectFloatFormat("9.223372036854776e+18", 9.223372036854776e18);
    try expectFloatFormat("1e+20", 1e20);
    try expectFloatFormat("1e+100", 1e100);
    try expectFloatFormat("1.7976931348623157e+308", 1.7976931348623157e308);
    try expectFloatFormat("0.0001", 0.0001);
    try expectFloatFormat("0.00001", 0.00001);
    try expectFloatFormat("0.00002", 0.00002);
    try expectFloatFormat("0.00001234", 0.00001234);
    try expectFloatFormat("1e-6", 1e-6);
    try expectFloatFormat("1.5e-6", 1.5e-6);
    try expectFloatFormat("5e-6", 5e-6);
    try expectFloatFormat("1e-7", 1e-7);
    try expectFloatFormat("-2.5e-10", -2.5e-10);
    try expectFloatFormat("2.2250738585072014e-308", 2.2250738585072014e-308);
    try expectFloatFormat("5e-324", 5e-324);
    try expectFloatFormat("0.3333333333333333", 1.0 / 3.0);
    try expectFloatFormat("123456.789", 123456.789);
}

test "float format: more values observed from the reference" {
    // Written by dataset-rt 0.4.8 and read back from its shard.
    const three: f64 = 3.0;
    try expectFloatFormat("90.33333333333333", 271.0 / three);
    try expectFloatFormat("1.152921504606847e+18", 0x1p60);
    try expectFloatFormat("-9007199254740991.0", -9007199254740991.0);
    try expectFloatFormat("1000000000000000.5", 1e15 + 0.5);
    try expectFloatFormat("999999999999999.9", 999999999999999.9);
    try expectFloatFormat("9.999999999999999e-6", 0.000009999999999999999);
    try expectFloatFormat("0.30000000000000004", @as(f64, 0.1) + @as(f64, 0.2));
    try expectFloatFormat("1e+22", 1e22);
    try expectFloatFormat("-1.3955996285218e-308", @bitCast(@as(u64, 0x800a09128fe46024)));
    try expectFloatFormat("0.0007300000000000001", @bitCast(@as(u64, 0x3f47ebaf102363b3)));
    // Largest magnitude lengths fit the buffer.
    try expectFloatFormat("-2.2250738585072014e-308", -2.2250738585072014e-308);
    try expectFloatFormat("-0.000012345678901234568", -0.000012345678901234568);
    // Non-finite floats are written as null, like the reference.
    var buf: [max_float_len]u8 = undefined;
    try testing.expectEqualStrings("null", formatFloat(&buf, std.math.nan(f64)));
    try testing.expectEqualStrings("null", formatFloat(&buf, -std.math.inf(f64)));
}

test "271 / 3.0 round-trips bit for bit (the reference reads 90.33333333333331)" {
    const gpa = testing.allocator;
    const three: f64 = 3.0;
    const value = 271.0 / three;
    const fields = [_]Field{.{ .name = "x", .kind = .float }};
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    try encodeRecord(gpa, &out, &fields, &.{.{ .float = value }});
    try testing.expectEqualStrings("{\"x\":90.33333333333333}", out.items);
    var parsed: [1]Value = undefined;
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(gpa);
    var diag: Diagnostic = .{};
    try parseRecord(out.items, &fields, &parsed, &scratch, gpa, &diag);
    try testing.expectEqual(@as(u64, @bitCast(value)), @as(u64, @bitCast(parsed[0].float)));
}

const GoldenRecord = struct { f: u64, g: u64, i: i64, b: bool, s: []const u8, json: []const u8 };

/// Records written by dataset-rt 0.4.8 (schema b:bool, f:float, g:float, i:int, s:string),
/// copied from its shard bytes: random bit patterns, subnormals, huge and tiny values,
/// integral values up to 2**60, and strings with every escape class.
const golden_records = [_]GoldenRecord{
    .{ .f = 0xd1f6f86c029a7245, .g = 0x3e065917e9f4eea0, .i = -746, .b = true, .s = "\x00", .json = "{\"b\":true,\"f\":-7.139820454309632e+86,\"g\":6.504130185074864e-10,\"i\":-746,\"s\":\"\\u0000\"}" },
    .{ .f = 0x800a09128fe46024, .g = 0x2fd2b7a48d9fe5b9, .i = -9223372036854775808, .b = true, .s = "\x01", .json = "{\"b\":true,\"f\":-1.3955996285218e-308,\"g\":2.525722336173709e-78,\"i\":-9223372036854775808,\"s\":\"\\u0001\"}" },
    .{ .f = 0xc03f000000000000, .g = 0x4041733333333333, .i = -9223372036854775808, .b = true, .s = "\x02", .json = "{\"b\":true,\"f\":-31.0,\"g\":34.9,\"i\":-9223372036854775808,\"s\":\"\\u0002\"}" },
    .{ .f = 0x3d2b88193a3f28cf, .g = 0xa02a752d05f79c16, .i = 0, .b = false, .s = "\x03", .json = "{\"b\":false,\"f\":4.8906008028206936e-14,\"g\":-9.866533884370552e-154,\"i\":0,\"s\":\"\\u0003\"}" },
    .{ .f = 0xf82dd70625e6fa94, .g = 0x800bc90a2e80dbd5, .i = 0, .b = false, .s = "\x04", .json = "{\"b\":false,\"f\":-7.882137911686828e+270,\"g\":-1.638949298569966e-308,\"i\":0,\"s\":\"\\u0004\"}" },
    .{ .f = 0x441431a27d07a13d, .g = 0x3ee4f8b588e368f1, .i = -1, .b = false, .s = "\x05", .json = "{\"b\":false,\"f\":9.312786e+19,\"g\":0.00001,\"i\":-1,\"s\":\"\\u0005\"}" },
    .{ .f = 0x3fc5027bb4d23bec, .g = 0x3fd3333333333334, .i = 9223372036854775807, .b = true, .s = "\x06", .json = "{\"b\":true,\"f\":0.16413828210031,\"g\":0.30000000000000004,\"i\":9223372036854775807,\"s\":\"\\u0006\"}" },
    .{ .f = 0x4030aaaaaaaaaaab, .g = 0x4358f97ce36c60f7, .i = -9223372036854775808, .b = true, .s = "\x07", .json = "{\"b\":true,\"f\":16.666666666666668,\"g\":2.811885691138966e+16,\"i\":-9223372036854775808,\"s\":\"\\u0007\"}" },
    .{ .f = 0x4480f0cf064dd592, .g = 0xc123317e3afe8eb6, .i = -5504607663910005392, .b = true, .s = "\x08", .json = "{\"b\":true,\"f\":1e+22,\"g\":-628927.1152233693,\"i\":-5504607663910005392,\"s\":\"\\b\"}" },
    .{ .f = 0x41329d2f1f19d181, .g = 0x3fe1cf5d34994055, .i = 1, .b = false, .s = "\x09", .json = "{\"b\":false,\"f\":1219887.1214877071,\"g\":0.5565629985158106,\"i\":1,\"s\":\"\\t\"}" },
    .{ .f = 0x29aa57a529ddf4c7, .g = 0xbed1c250d950dc3b, .i = 9223372036854775807, .b = true, .s = "\x0a", .json = "{\"b\":true,\"f\":5.608236388575786e-108,\"g\":-4.234086550750653e-6,\"i\":9223372036854775807,\"s\":\"\\n\"}" },
    .{ .f = 0x0009b852d5d3cee2, .g = 0x188b2694d9c1aa99, .i = -1, .b = false, .s = "\x0b", .json = "{\"b\":false,\"f\":1.3517343112277525e-308,\"g\":1.9042936747643288e-190,\"i\":-1,\"s\":\"\\u000b\"}" },
    .{ .f = 0xc380d055487c717a, .g = 0x40430ccccccccccd, .i = -9223372036854775808, .b = true, .s = "\x0c", .json = "{\"b\":true,\"f\":-1.5144525869706016e+17,\"g\":38.1,\"i\":-9223372036854775808,\"s\":\"\\f\"}" },
    .{ .f = 0x3d9011329e27418d, .g = 0x6a7d5adc3139950d, .i = 0, .b = false, .s = "\x0d", .json = "{\"b\":false,\"f\":3.653253455951702e-12,\"g\":9.203605713434622e+204,\"i\":0,\"s\":\"\\r\"}" },
    .{ .f = 0x76aef09af22c7809, .g = 0x800bfc8433af061b, .i = 1, .b = false, .s = "\x0e", .json = "{\"b\":false,\"f\":4.8712972097194895e+263,\"g\":-1.6669130020433213e-308,\"i\":1,\"s\":\"\\u000e\"}" },
    .{ .f = 0x433e4fcbcc638bba, .g = 0xc340000000000000, .i = -6342481847567159589, .b = true, .s = "\x0f", .json = "{\"b\":true,\"f\":8531986027350970.0,\"g\":-9007199254740992.0,\"i\":-6342481847567159589,\"s\":\"\\u000f\"}" },
    .{ .f = 0x3fd198741df84bb4, .g = 0x43cccdb5a581d09b, .i = 9223372036854775807, .b = false, .s = "\x10", .json = "{\"b\":false,\"f\":0.274930028216825,\"g\":4.15102945147966e+18,\"i\":9223372036854775807,\"s\":\"\\u0010\"}" },
    .{ .f = 0x404936db6db6db6e, .g = 0xc0ffbd6000000000, .i = -9223372036854775808, .b = true, .s = "\x11", .json = "{\"b\":true,\"f\":50.42857142857143,\"g\":-130006.0,\"i\":-9223372036854775808,\"s\":\"\\u0011\"}" },
    .{ .f = 0x43e0000000000000, .g = 0xc1284e71ce26e9a5, .i = 1, .b = false, .s = "\x12", .json = "{\"b\":false,\"f\":9.223372036854776e+18,\"g\":-796472.9026406301,\"i\":1,\"s\":\"\\u0012\"}" },
    .{ .f = 0x40e72c37451d2de7, .g = 0x3fb352e693bd3fd0, .i = -1, .b = false, .s = "\x13", .json = "{\"b\":false,\"f\":47457.72718676534,\"g\":0.07548371416964916,\"i\":-1,\"s\":\"\\u0013\"}" },
    .{ .f = 0x4e779665d14b5d87, .g = 0xbe6cbff63b154351, .i = -9223372036854775808, .b = true, .s = "\x14", .json = "{\"b\":true,\"f\":1.0174680038527165e+70,\"g\":-5.355077038283289e-8,\"i\":-9223372036854775808,\"s\":\"\\u0014\"}" },
    .{ .f = 0x800574d8ff45ddff, .g = 0x0a72aa2dddd1ddbf, .i = -9223372036854775808, .b = true, .s = "\x15", .json = "{\"b\":true,\"f\":-7.58810834851834e-309,\"g\":2.427874277828708e-258,\"i\":-9223372036854775808,\"s\":\"\\u0015\"}" },
    .{ .f = 0xc0a7760000000000, .g = 0x40582aaaaaaaaaab, .i = -9223372036854775808, .b = true, .s = "\x16", .json = "{\"b\":true,\"f\":-3003.0,\"g\":96.66666666666667,\"i\":-9223372036854775808,\"s\":\"\\u0016\"}" },
    .{ .f = 0x3e0cdda00a056945, .g = 0x009b0178c3f2332a, .i = -9223372036854775808, .b = true, .s = "\x17", .json = "{\"b\":true,\"f\":8.401031155824994e-10,\"g\":9.614365774987512e-306,\"i\":-9223372036854775808,\"s\":\"\\u0017\"}" },
    .{ .f = 0x201c2888bb9cf044, .g = 0x8006a225751d0db6, .i = 9223372036854775807, .b = true, .s = "\x18", .json = "{\"b\":true,\"f\":5.25036167825715e-154,\"g\":-9.224855909864945e-309,\"i\":9223372036854775807,\"s\":\"\\u0018\"}" },
    .{ .f = 0x418c9c3800000000, .g = 0x444b1ae4d6e2ef50, .i = -203, .b = true, .s = "\x19", .json = "{\"b\":true,\"f\":60000000.0,\"g\":1e+21,\"i\":-203,\"s\":\"\\u0019\"}" },
    .{ .f = 0x3fd84d4bbc85e074, .g = 0x3f47ebaf102363b3, .i = -9223372036854775808, .b = true, .s = "\x1a", .json = "{\"b\":true,\"f\":0.3797177640003675,\"g\":0.0007300000000000001,\"i\":-9223372036854775808,\"s\":\"\\u001a\"}" },
    .{ .f = 0x40740aaaaaaaaaab, .g = 0x41baefe5fc000000, .i = -1, .b = true, .s = "\x1b", .json = "{\"b\":true,\"f\":320.6666666666667,\"g\":451929596.0,\"i\":-1,\"s\":\"\\u001b\"}" },
    .{ .f = 0x3ee4f8b588e368f1, .g = 0xc12c5f1391fd51a4, .i = -9223372036854775808, .b = true, .s = "\x1c", .json = "{\"b\":true,\"f\":0.00001,\"g\":-929673.7851357949,\"i\":-9223372036854775808,\"s\":\"\\u001c\"}" },
    .{ .f = 0x412996ac2f7a5f86, .g = 0x3fe479bba0db0316, .i = -851, .b = false, .s = "\x1d", .json = "{\"b\":false,\"f\":838486.092730508,\"g\":0.6398599759778303,\"i\":-851,\"s\":\"\\u001d\"}" },
    .{ .f = 0x8f8236d511db117a, .g = 0x3d65a98c9fe0f23e, .i = 1, .b = false, .s = "\x1e", .json = "{\"b\":false,\"f\":-5.728530226871389e-234,\"g\":6.156796533213552e-13,\"i\":1,\"s\":\"\\u001e\"}" },
    .{ .f = 0x000bbf3e5ec0533a, .g = 0x674ecffaa9c54447, .i = 0, .b = true, .s = "\x1f", .json = "{\"b\":true,\"f\":1.6336277330554194e-308,\"g\":4.2901559446542313e+189,\"i\":0,\"s\":\"\\u001f\"}" },
    .{ .f = 0x42ae33e84eb93a00, .g = 0x40105c28f5c28f5c, .i = 0, .b = false, .s = "\"", .json = "{\"b\":false,\"f\":16604144819357.0,\"g\":4.09,\"i\":0,\"s\":\"\\\"\"}" },
    .{ .f = 0xbe47f5ae276804b0, .g = 0x21a529278c2dc5d2, .i = -9223372036854775808, .b = true, .s = "\\", .json = "{\"b\":true,\"f\":-1.1157099450052097e-8,\"g\":1.3239249772737447e-146,\"i\":-9223372036854775808,\"s\":\"\\\\\"}" },
    .{ .f = 0x22d0e913c5b86663, .g = 0x000016efa10d9421, .i = 9223372036854775807, .b = false, .s = "/", .json = "{\"b\":false,\"f\":5.546990304884533e-141,\"g\":1.2459572264836e-310,\"i\":9223372036854775807,\"s\":\"/\"}" },
    .{ .f = 0x3fa9f5c0b6e9e186, .g = 0x43e0000000000000, .i = 0, .b = false, .s = "\x7f", .json = "{\"b\":false,\"f\":0.05070307,\"g\":9.223372036854776e+18,\"i\":0,\"s\":\"\x7f\"}" },
    .{ .f = 0x3fca1d99a4053558, .g = 0x3f1a36e2eb1c432d, .i = -1, .b = false, .s = "\xe2\x80\xa8", .json = "{\"b\":false,\"f\":0.20402832516485137,\"g\":0.0001,\"i\":-1,\"s\":\"\xe2\x80\xa8\"}" },
    .{ .f = 0x3f44727dcbddb984, .g = 0xc2dc49e2e36da980, .i = 1495013359150761423, .b = true, .s = "\xe2\x80\xa9", .json = "{\"b\":true,\"f\":0.000624,\"g\":-124414658983590.0,\"i\":1495013359150761423,\"s\":\"\xe2\x80\xa9\"}" },
    .{ .f = 0x444b1ae4d6e2ef50, .g = 0xc144f95fdd2b0614, .i = 989, .b = false, .s = "\xf0\x9f\x98\x80", .json = "{\"b\":false,\"f\":1e+21,\"g\":-2749119.7278754804,\"i\":989,\"s\":\"\xf0\x9f\x98\x80\"}" },
    .{ .f = 0xc133fe9eb0dbee10, .g = 0x3fed56b3ae98807b, .i = 7366436639278505573, .b = false, .s = "\xc3\xa9", .json = "{\"b\":false,\"f\":-1310366.6908558644,\"g\":0.9168337259361715,\"i\":7366436639278505573,\"s\":\"\xc3\xa9\"}" },
    .{ .f = 0xd47c1e66e663e86a, .g = 0xbf48f42fed6f1aa0, .i = 9223372036854775807, .b = true, .s = "\xe4\xb8\xad", .json = "{\"b\":true,\"f\":-9.609808281815921e+98,\"g\":-0.0007615312596208242,\"i\":9223372036854775807,\"s\":\"\xe4\xb8\xad\"}" },
    .{ .f = 0x00063c75fb3a4c43, .g = 0xbd4decd41f051604, .i = -2657199234072533228, .b = true, .s = "\xc2\x80", .json = "{\"b\":true,\"f\":8.672469082351634e-309,\"g\":-2.1263070743919893e-13,\"i\":-2657199234072533228,\"s\":\"\xc2\x80\"}" },
    .{ .f = 0x430191cfd849f488, .g = 0x403fe66666666666, .i = 0, .b = true, .s = "\xc3\xbf", .json = "{\"b\":true,\"f\":618174559633041.0,\"g\":31.9,\"i\":0,\"s\":\"\xc3\xbf\"}" },
    .{ .f = 0x3e9998815785c85a, .g = 0xd0bfee55365cae3f, .i = 4889925977527062839, .b = true, .s = "\xef\xbf\xbf", .json = "{\"b\":true,\"f\":3.8140600324484486e-7,\"g\":-9.46523080067352e+80,\"i\":4889925977527062839,\"s\":\"\xef\xbf\xbf\"}" },
    .{ .f = 0x3cc77fbaf6e9b72b, .g = 0x8008c278cbe3dbfb, .i = -46, .b = false, .s = "\xf4\x8f\xbf\xbf", .json = "{\"b\":false,\"f\":6.52226789297338e-16,\"g\":-1.2181800577652415e-308,\"i\":-46,\"s\":\"\xf4\x8f\xbf\xbf\"}" },
    .{ .f = 0x429827fd9a47aa00, .g = 0x437b69b4ba630f35, .i = -9223372036854775808, .b = true, .s = "a", .json = "{\"b\":true,\"f\":6640009384426.5,\"g\":1.2345678901234568e+17,\"i\":-9223372036854775808,\"s\":\"a\"}" },
    .{ .f = 0x3fda965eba8e9f76, .g = 0x4003a7ef9db22d0e, .i = 9223372036854775807, .b = true, .s = "Z", .json = "{\"b\":true,\"f\":0.4154278585287935,\"g\":2.457,\"i\":9223372036854775807,\"s\":\"Z\"}" },
    .{ .f = 0x4022924924924925, .g = 0xc381e209caba3492, .i = -1, .b = true, .s = " ", .json = "{\"b\":true,\"f\":9.285714285714286,\"g\":-1.610754012116793e+17,\"i\":-1,\"s\":\" \"}" },
    .{ .f = 0x3fd3333333333334, .g = 0x4143a4e0306e43a0, .i = 0, .b = false, .s = "'", .json = "{\"b\":false,\"f\":0.30000000000000004,\"g\":2574784.378364995,\"i\":0,\"s\":\"'\"}" },
    .{ .f = 0xc129dcf8752f55a8, .g = 0x3fe2d6b121c0b0c5, .i = 1, .b = false, .s = "<", .json = "{\"b\":false,\"f\":-847484.2288767593,\"g\":0.5887075099212998,\"i\":1,\"s\":\"<\"}" },
    .{ .f = 0x4a39cba3af5877ef, .g = 0x3ecce4c030763038, .i = -568, .b = true, .s = ">", .json = "{\"b\":true,\"f\":3.770011635597148e+49,\"g\":3.4443804712344193e-6,\"i\":-568,\"s\":\">\"}" },
    .{ .f = 0x403e924924924925, .g = 0x432cefcf9619270e, .i = -6464556922759295651, .b = false, .s = "\x1b/\x03Z\x03\x0c\x04\xe2\x80\xa9&\xc3\xa9", .json = "{\"b\":false,\"f\":30.571428571428573,\"g\":4072487101698951.0,\"i\":-6464556922759295651,\"s\":\"\\u001b/\\u0003Z\\u0003\\f\\u0004\xe2\x80\xa9&\xc3\xa9\"}" },
    .{ .f = 0xee548243c9af65c8, .g = 0x800728c274c2e0cb, .i = -9223372036854775808, .b = false, .s = "\x01", .json = "{\"b\":false,\"f\":-2.965364214288555e+223,\"g\":-9.956116850191497e-309,\"i\":-9223372036854775808,\"s\":\"\\u0001\"}" },
    .{ .f = 0x800a78caa6987d2a, .g = 0x7298acc4c0c26c4f, .i = 0, .b = false, .s = "\x0d\xf0\x9f\x98\x80\x1d\xe2\x80\xa9\x06", .json = "{\"b\":false,\"f\":-1.4562888963343267e-308,\"g\":1.0530075992272569e+244,\"i\":0,\"s\":\"\\r\xf0\x9f\x98\x80\\u001d\xe2\x80\xa9\\u0006\"}" },
    .{ .f = 0x3ee4f8b588e368f1, .g = 0xc0bb68b05ba9adb8, .i = -331773010573197673, .b = false, .s = "", .json = "{\"b\":false,\"f\":0.00001,\"g\":-7016.688898663437,\"i\":-331773010573197673,\"s\":\"\"}" },
    .{ .f = 0x44ac84344b8e405b, .g = 0x7fefffffffffffff, .i = -203, .b = true, .s = "\xef\xbf\xbf\x0b\x03\x16\x19", .json = "{\"b\":true,\"f\":6.73325e+22,\"g\":1.7976931348623157e+308,\"i\":-203,\"s\":\"\xef\xbf\xbf\\u000b\\u0003\\u0016\\u0019\"}" },
    .{ .f = 0x40ccd68000000000, .g = 0x3f4ab4b72c5197a2, .i = 9223372036854775807, .b = false, .s = "\x09\xe2\x80\xa9\x16\x0c\x0e\xc2\x80\xf4\x8f\xbf\xbf\x03\xef\xbf\xbf\xf4\x8f\xbf\xbf", .json = "{\"b\":false,\"f\":14765.0,\"g\":0.000815,\"i\":9223372036854775807,\"s\":\"\\t\xe2\x80\xa9\\u0016\\f\\u000e\xc2\x80\xf4\x8f\xbf\xbf\\u0003\xef\xbf\xbf\xf4\x8f\xbf\xbf\"}" },
    .{ .f = 0xc12e3eada131bdfd, .g = 0x3fe712a4bc89ac5c, .i = -1, .b = false, .s = "\x00\x05\x02\x01\"\\'\\\x09", .json = "{\"b\":false,\"f\":-991062.8148326274,\"g\":0.7210258180979383,\"i\":-1,\"s\":\"\\u0000\\u0005\\u0002\\u0001\\\"\\\\'\\\\\\t\"}" },
    .{ .f = 0x3fe67799bfb63613, .g = 0x42f7dfcdece40000, .i = -565, .b = true, .s = "\x0a\xef\xbf\xbfa\\", .json = "{\"b\":true,\"f\":0.7020996803636897,\"g\":420000000000000.0,\"i\":-565,\"s\":\"\\n\xef\xbf\xbfa\\\\\"}" },
    .{ .f = 0x3ef0f6976775701a, .g = 0xd00c6e05fea0e75e, .i = 1, .b = true, .s = "\x09\xf0\x9f\x98\x80\xef\xbf\xbf\"\x0f\x1d\x06", .json = "{\"b\":true,\"f\":0.000016177413696069708,\"g\":-4.1149293795073325e+77,\"i\":1,\"s\":\"\\t\xf0\x9f\x98\x80\xef\xbf\xbf\\\"\\u000f\\u001d\\u0006\"}" },
    .{ .f = 0xc64cfa28ce4369dd, .g = 0x3d80176f8c61976a, .i = 0, .b = false, .s = "\xef\xbf\xbf", .json = "{\"b\":false,\"f\":-4.591618267877156e+30,\"g\":1.8293969609383667e-12,\"i\":0,\"s\":\"\xef\xbf\xbf\"}" },
    .{ .f = 0x4050c66666666666, .g = 0xc0b6110000000000, .i = 9223372036854775807, .b = true, .s = "\x0e\x0d\xc3\xbf\x0e\x1b<a\x18\x0b\x05\x07", .json = "{\"b\":true,\"f\":67.1,\"g\":-5649.0,\"i\":9223372036854775807,\"s\":\"\\u000e\\r\xc3\xbf\\u000e\\u001b<a\\u0018\\u000b\\u0005\\u0007\"}" },
    .{ .f = 0x5b84348c94ed25c6, .g = 0x800d81e537dcd024, .i = 0, .b = false, .s = "\x09\x04\x1b\\\x06", .json = "{\"b\":false,\"f\":7.170885131222957e+132,\"g\":-1.8784356991213273e-308,\"i\":0,\"s\":\"\\t\\u0004\\u001b\\\\\\u0006\"}" },
    .{ .f = 0x0001b1672e58ce2f, .g = 0x0755e57f512eef5d, .i = -505188422152799867, .b = false, .s = "\\<\x05\xc3\xa9\xc2\x80\\\x1f\x0e \x1f", .json = "{\"b\":false,\"f\":2.354379391749445e-309,\"g\":2.529753064642845e-273,\"i\":-505188422152799867,\"s\":\"\\\\<\\u0005\xc3\xa9\xc2\x80\\\\\\u001f\\u000e \\u001f\"}" },
    .{ .f = 0x4341c37937e08000, .g = 0xc1140a0c45ff0bdb, .i = 9223372036854775807, .b = true, .s = "\x07\x02\x1c\x13", .json = "{\"b\":true,\"f\":1e+16,\"g\":-328323.06835573696,\"i\":9223372036854775807,\"s\":\"\\u0007\\u0002\\u001c\\u0013\"}" },
    .{ .f = 0x46b78079320d9860, .g = 0x7fefffffffffffff, .i = -682, .b = false, .s = "\xef\xbf\xbf", .json = "{\"b\":false,\"f\":4.766741338824952e+32,\"g\":1.7976931348623157e+308,\"i\":-682,\"s\":\"\xef\xbf\xbf\"}" },
    .{ .f = 0x426e3b712142e000, .g = 0x4033333333333333, .i = -1, .b = true, .s = " '\x0eZ\x07\x07\xc2\x80\x0b", .json = "{\"b\":true,\"f\":1038770309655.0,\"g\":19.2,\"i\":-1,\"s\":\" '\\u000eZ\\u0007\\u0007\xc2\x80\\u000b\"}" },
    .{ .f = 0xc0fe77f13f0d68f6, .g = 0x3fe94f0408ccb191, .i = -9223372036854775808, .b = true, .s = "\xf0\x9f\x98\x80\x12", .json = "{\"b\":true,\"f\":-124799.07789364815,\"g\":0.7908954784266361,\"i\":-9223372036854775808,\"s\":\"\xf0\x9f\x98\x80\\u0012\"}" },
    .{ .f = 0x3fc532c27b475e94, .g = 0x45dc479eeb182a56, .i = -9223372036854775808, .b = true, .s = "\x0a\x15\x1c\x01\x15\x1b\x1c\x1b", .json = "{\"b\":true,\"f\":0.16561156291458146,\"g\":3.5008657915283e+28,\"i\":-9223372036854775808,\"s\":\"\\n\\u0015\\u001c\\u0001\\u0015\\u001b\\u001c\\u001b\"}" },
    .{ .f = 0x3f1058d53fbb5b18, .g = 0x93e31f13dac9f337, .i = -9223372036854775808, .b = false, .s = "\x7f\xf4\x8f\xbf\xbfa\x06\x09\x03/Z\x0a\x02", .json = "{\"b\":false,\"f\":0.00006235887115778012,\"g\":-7.099907425201166e-213,\"i\":-9223372036854775808,\"s\":\"\x7f\xf4\x8f\xbf\xbfa\\u0006\\t\\u0003/Z\\n\\u0002\"}" },
    .{ .f = 0x0235d9eb26addee7, .g = 0x3f745edcb9e2574c, .i = 988, .b = false, .s = "\x1b\x7f\x03", .json = "{\"b\":false,\"f\":5.220600675935643e-298,\"g\":0.004973280154578163,\"i\":988,\"s\":\"\\u001b\x7f\\u0003\"}" },
    .{ .f = 0x4070faaaaaaaaaab, .g = 0x41c1be6058800000, .i = 9223372036854775807, .b = false, .s = "\xe4\xb8\xad\x08\"\x18\x10", .json = "{\"b\":false,\"f\":271.6666666666667,\"g\":595378353.0,\"i\":9223372036854775807,\"s\":\"\xe4\xb8\xad\\b\\\"\\u0018\\u0010\"}" },
    .{ .f = 0xb08a34c1b68b3f70, .g = 0x000328337602916b, .i = 0, .b = false, .s = "\xf0\x9f\x98\x80\xe4\xb8\xad\xf0\x9f\x98\x80\x07\x12\x1b&\xf0\x9f\x98\x80\x11", .json = "{\"b\":false,\"f\":-7.242244198025275e-75,\"g\":4.390397853455095e-309,\"i\":0,\"s\":\"\xf0\x9f\x98\x80\xe4\xb8\xad\xf0\x9f\x98\x80\\u0007\\u0012\\u001b&\xf0\x9f\x98\x80\\u0011\"}" },
    .{ .f = 0x000d27921c776287, .g = 0x62c2fdeca6823425, .i = 801, .b = false, .s = "\x0e\x16>", .json = "{\"b\":false,\"f\":1.829368563358442e-308,\"g\":5.599584978408412e+167,\"i\":801,\"s\":\"\\u000e\\u0016>\"}" },
    .{ .f = 0x3eb0c6f7a0b5ed8d, .g = 0xc101468ac317a037, .i = -9223372036854775808, .b = true, .s = "\x0e\"\\\x0f", .json = "{\"b\":true,\"f\":1e-6,\"g\":-141521.34525990646,\"i\":-9223372036854775808,\"s\":\"\\u000e\\\"\\\\\\u000f\"}" },
    .{ .f = 0x408d7d4bc6a7ef9e, .g = 0x444b1ae4d6e2ef50, .i = 334, .b = true, .s = "\x07\"\xf0\x9f\x98\x80\x12\x1b\x7f\x19", .json = "{\"b\":true,\"f\":943.662,\"g\":1e+21,\"i\":334,\"s\":\"\\u0007\\\"\xf0\x9f\x98\x80\\u0012\\u001b\x7f\\u0019\"}" },
    .{ .f = 0xc2f3b3b400cff0c0, .g = 0x406f0aaaaaaaaaab, .i = 407, .b = false, .s = "\x0d\xc3\xa9", .json = "{\"b\":false,\"f\":-346600640413452.0,\"g\":248.33333333333334,\"i\":407,\"s\":\"\\r\xc3\xa9\"}" },
    .{ .f = 0xc1384fd3c9cd7c65, .g = 0x3febb8c38b8674f8, .i = -956, .b = false, .s = "\x0c&\x06\xe2\x80\xa8\x0f\x16\xe2\x80\xa9", .json = "{\"b\":false,\"f\":-1593299.7882917162,\"g\":0.8663041806318281,\"i\":-956,\"s\":\"\\f&\\u0006\xe2\x80\xa8\\u000f\\u0016\xe2\x80\xa9\"}" },
    .{ .f = 0x3fda053d87e8e5ac, .g = 0x3f7cac083126e979, .i = -1, .b = true, .s = "\x1a>\x0b&", .json = "{\"b\":true,\"f\":0.4065698458903977,\"g\":0.007,\"i\":-1,\"s\":\"\\u001a>\\u000b&\"}" },
    .{ .f = 0x3df75f75b90569ad, .g = 0x50d23804b5a348a7, .i = 445, .b = true, .s = "\xf0\x9f\x98\x80\xe2\x80\xa8", .json = "{\"b\":true,\"f\":3.401203147432514e-10,\"g\":2.1602257375219966e+81,\"i\":445,\"s\":\"\xf0\x9f\x98\x80\xe2\x80\xa8\"}" },
    .{ .f = 0xb3f65f71b5e3640a, .g = 0x3d854a4807df3697, .i = -896, .b = true, .s = "\x18\xe4\xb8\xad\x17\x1c\x11\xe4\xb8\xad\x0e>\x18/\x0d", .json = "{\"b\":true,\"f\":-2.2276232903418624e-58,\"g\":2.420411147115362e-12,\"i\":-896,\"s\":\"\\u0018\xe4\xb8\xad\\u0017\\u001c\\u0011\xe4\xb8\xad\\u000e>\\u0018/\\r\"}" },
    .{ .f = 0x40230f5c28f5c28f, .g = 0xc2ba73e1b1b3fe00, .i = 0, .b = false, .s = "\\\x18\x11\x16\x19\x19\x16<\xe4\xb8\xad", .json = "{\"b\":false,\"f\":9.53,\"g\":-29085010080766.0,\"i\":0,\"s\":\"\\\\\\u0018\\u0011\\u0016\\u0019\\u0019\\u0016<\xe4\xb8\xad\"}" },
    .{ .f = 0x800000000000066d, .g = 0x80018d2f94641069, .i = 0, .b = false, .s = "\"Z\x02\x11\x10\x08\x0a\x1c\x1c\x15", .json = "{\"b\":false,\"f\":-8.127e-321,\"g\":-2.15763640048359e-309,\"i\":0,\"s\":\"\\\"Z\\u0002\\u0011\\u0010\\b\\n\\u001c\\u001c\\u0015\"}" },
    .{ .f = 0x00083cf16c7db836, .g = 0xdeaf0b6ee9a5bc7e, .i = 9223372036854775807, .b = false, .s = "\xe2\x80\xa8\\a\x1e\x18\xe2\x80\xa9", .json = "{\"b\":false,\"f\":1.145643084876109e-308,\"g\":-1.2404944117637995e+148,\"i\":9223372036854775807,\"s\":\"\xe2\x80\xa8\\\\a\\u001e\\u0018\xe2\x80\xa9\"}" },
    .{ .f = 0x4341c37937e08000, .g = 0xc13092558d60c672, .i = 0, .b = true, .s = "'\x1e&/\x0e\x0d", .json = "{\"b\":true,\"f\":1e+16,\"g\":-1086037.552257922,\"i\":0,\"s\":\"'\\u001e&/\\u000e\\r\"}" },
    .{ .f = 0x3ee3bbf48d5b1cdc, .g = 0x3ee4f8b4290b6ad9, .i = 1, .b = true, .s = "\x11\x1b\x10\xf4\x8f\xbf\xbf<\x1e>", .json = "{\"b\":true,\"f\":9.41e-6,\"g\":9.99999e-6,\"i\":1,\"s\":\"\\u0011\\u001b\\u0010\xf4\x8f\xbf\xbf<\\u001e>\"}" },
    .{ .f = 0x419f08de8c000000, .g = 0x3f4e14bdfd2630ec, .i = 9223372036854775807, .b = true, .s = "\x01>", .json = "{\"b\":true,\"f\":130168739.0,\"g\":0.000918,\"i\":9223372036854775807,\"s\":\"\\u0001>\"}" },
    .{ .f = 0x413a213911872769, .g = 0x3fdbe342fc5175b6, .i = 9223372036854775807, .b = true, .s = "\x10\x7f>\x07\xe2\x80\xa8\x17\x01\x14\xc2\x80\x18", .json = "{\"b\":true,\"f\":1712441.0684685356,\"g\":0.43574595108460856,\"i\":9223372036854775807,\"s\":\"\\u0010\x7f>\\u0007\xe2\x80\xa8\\u0017\\u0001\\u0014\xc2\x80\\u0018\"}" },
    .{ .f = 0x3fe66966c4a02596, .g = 0x44ddea5075c21ea9, .i = 9223372036854775807, .b = false, .s = "\x0b \x07\xef\xbf\xbf", .json = "{\"b\":false,\"f\":0.7003663864463074,\"g\":5.6508385548e+23,\"i\":9223372036854775807,\"s\":\"\\u000b \\u0007\xef\xbf\xbf\"}" },
    .{ .f = 0xbdb7af2e8d013bb3, .g = 0xf78ebf484cd7c7f8, .i = 9223372036854775807, .b = true, .s = "\x0e\x02\x11\x0f\x0d\"\xc3\xbf\x07", .json = "{\"b\":true,\"f\":-2.1540749056693053e-11,\"g\":-7.931433595364836e+267,\"i\":9223372036854775807,\"s\":\"\\u000e\\u0002\\u0011\\u000f\\r\\\"\xc3\xbf\\u0007\"}" },
    .{ .f = 0x50a5cf48425eac2f, .g = 0xbdfd6c945809a057, .i = 1, .b = false, .s = "\x17\x06\x18\x0a\x14\x06\x15\x0d>a", .json = "{\"b\":false,\"f\":3.232499590011734e+80,\"g\":-4.281775698215831e-10,\"i\":1,\"s\":\"\\u0017\\u0006\\u0018\\n\\u0014\\u0006\\u0015\\r>a\"}" },
    .{ .f = 0x404ed55555555555, .g = 0xc171750600000000, .i = -9223372036854775808, .b = false, .s = "\x04\"\xef\xbf\xbf\x09<\x7f\xc3\xa9\x01\x1c", .json = "{\"b\":false,\"f\":61.666666666666664,\"g\":-18305120.0,\"i\":-9223372036854775808,\"s\":\"\\u0004\\\"\xef\xbf\xbf\\t<\x7f\xc3\xa9\\u0001\\u001c\"}" },
    .{ .f = 0x6117d538a931cf74, .g = 0x8004f4aa4b1f9d21, .i = 1009983820272488457, .b = true, .s = "\x0d\x0b\x10\x10\x03\x00", .json = "{\"b\":true,\"f\":5.2354562402278135e+159,\"g\":-6.89178171700199e-309,\"i\":1009983820272488457,\"s\":\"\\r\\u000b\\u0010\\u0010\\u0003\\u0000\"}" },
    .{ .f = 0x800b257699aebb40, .g = 0xf05aeaf6076ba34d, .i = 140, .b = false, .s = "\x03\x1f", .json = "{\"b\":false,\"f\":-1.5500894912407494e-308,\"g\":-1.6716158913427416e+233,\"i\":140,\"s\":\"\\u0003\\u001f\"}" },
    .{ .f = 0xc340000000000000, .g = 0xc1119dd040e2a668, .i = -9223372036854775808, .b = true, .s = "\xe2\x80\xa8\xc2\x80\x00\x05\x1c\x01\x0a\x1a", .json = "{\"b\":true,\"f\":-9007199254740992.0,\"g\":-288628.0633646012,\"i\":-9223372036854775808,\"s\":\"\xe2\x80\xa8\xc2\x80\\u0000\\u0005\\u001c\\u0001\\n\\u001a\"}" },
    .{ .f = 0x40e5b94000000000, .g = 0x8000000000000000, .i = 0, .b = true, .s = "\x1b\xe4\xb8\xad\x01", .json = "{\"b\":true,\"f\":44490.0,\"g\":-0.0,\"i\":0,\"s\":\"\\u001b\xe4\xb8\xad\\u0001\"}" },
    .{ .f = 0xc16123d800000000, .g = 0x404536db6db6db6e, .i = -1, .b = false, .s = "\x18\x00\x1d\\\x1a", .json = "{\"b\":false,\"f\":-8986304.0,\"g\":42.42857142857143,\"i\":-1,\"s\":\"\\u0018\\u0000\\u001d\\\\\\u001a\"}" },
    .{ .f = 0x4113eb5e98d2dd15, .g = 0x3fcd6a0163ce7474, .i = 9223372036854775807, .b = false, .s = "\x1f\x0f\xf4\x8f\xbf\xbf\x0e ", .json = "{\"b\":false,\"f\":326359.6492418808,\"g\":0.22979752896654626,\"i\":9223372036854775807,\"s\":\"\\u001f\\u000f\xf4\x8f\xbf\xbf\\u000e \"}" },
    .{ .f = 0x3fb228242861b4f0, .g = 0x4359c1d62a9f2000, .i = -1, .b = true, .s = "&\xe4\xb8\xad\\\x04\x03a\x7f", .json = "{\"b\":true,\"f\":0.07092500673180147,\"g\":2.9e+16,\"i\":-1,\"s\":\"&\xe4\xb8\xad\\\\\\u0004\\u0003a\x7f\"}" },
    .{ .f = 0x3d3bfb308c566828, .g = 0x42b24ae4297c8341, .i = 0, .b = true, .s = "\x0a\xe2\x80\xa8\x02\xe2\x80\xa8\x07 \x15\x1d\xef\xbf\xbf", .json = "{\"b\":true,\"f\":9.940922587021615e-14,\"g\":20112864803971.254,\"i\":0,\"s\":\"\\n\xe2\x80\xa8\\u0002\xe2\x80\xa8\\u0007 \\u0015\\u001d\xef\xbf\xbf\"}" },
    .{ .f = 0x7e409b0f62254a66, .g = 0x3df79a77a877ee89, .i = 9223372036854775807, .b = true, .s = "\x00\x13\\\x18a\x04\x1c/\x0e\x15", .json = "{\"b\":true,\"f\":1.3900901725861952e+300,\"g\":3.4347450618810476e-10,\"i\":9223372036854775807,\"s\":\"\\u0000\\u0013\\\\\\u0018a\\u0004\\u001c/\\u000e\\u0015\"}" },
    .{ .f = 0x4051400000000000, .g = 0x40ddcac000000000, .i = -5177056669684435246, .b = false, .s = "\xf4\x8f\xbf\xbf\x09\x11\x03 a\x01", .json = "{\"b\":false,\"f\":69.0,\"g\":30507.0,\"i\":-5177056669684435246,\"s\":\"\xf4\x8f\xbf\xbf\\t\\u0011\\u0003 a\\u0001\"}" },
    .{ .f = 0xb43efc0a3b67281e, .g = 0x000e5698bacfc6dd, .i = 9223372036854775807, .b = true, .s = "\x0b\x14\x05\x06\x1c\xef\xbf\xbf&", .json = "{\"b\":true,\"f\":-4.9361205911176787e-57,\"g\":1.9939815773781095e-308,\"i\":9223372036854775807,\"s\":\"\\u000b\\u0014\\u0005\\u0006\\u001c\xef\xbf\xbf&\"}" },
    .{ .f = 0x000b08510c4b7077, .g = 0x96e68c69cbd259db, .i = -9223372036854775808, .b = false, .s = "Z\x11\"", .json = "{\"b\":false,\"f\":1.534256108673875e-308,\"g\":-2.3566241121785453e-198,\"i\":-9223372036854775808,\"s\":\"Z\\u0011\\\"\"}" },
    .{ .f = 0xc340000000000000, .g = 0x411f7b4965610268, .i = -9223372036854775808, .b = true, .s = "\x1d\x03\xe2\x80\xa9\"", .json = "{\"b\":true,\"f\":-9007199254740992.0,\"g\":515794.349002874,\"i\":-9223372036854775808,\"s\":\"\\u001d\\u0003\xe2\x80\xa9\\\"\"}" },
    .{ .f = 0x41141c03dee392e2, .g = 0x3ee4f8b4290b6ad9, .i = -1, .b = true, .s = "a \x06&<\x07a\x14", .json = "{\"b\":true,\"f\":329472.967665,\"g\":9.99999e-6,\"i\":-1,\"s\":\"a \\u0006&<\\u0007a\\u0014\"}" },
    .{ .f = 0xc34f38d1e2b52f9c, .g = 0x4051400000000000, .i = 9223372036854775807, .b = false, .s = "\xe2\x80\xa9\x17\x1f\x13\x17\x1c\x0c\xe2\x80\xa8\x04a", .json = "{\"b\":false,\"f\":-1.7576396761751352e+16,\"g\":69.0,\"i\":9223372036854775807,\"s\":\"\xe2\x80\xa9\\u0017\\u001f\\u0013\\u0017\\u001c\\f\xe2\x80\xa8\\u0004a\"}" },
    .{ .f = 0xc1399c00b7f43bcb, .g = 0x3fee80fef2851749, .i = 0, .b = false, .s = "\x09\x07\x00\\", .json = "{\"b\":false,\"f\":-1678336.7185704585,\"g\":0.9532465683666739,\"i\":0,\"s\":\"\\t\\u0007\\u0000\\\\\"}" },
    .{ .f = 0x3fb8f28f5dd8a6a8, .g = 0x42c305f1ec01ab27, .i = 9223372036854775807, .b = true, .s = "\"'", .json = "{\"b\":true,\"f\":0.09745117226762068,\"g\":41832509080406.305,\"i\":9223372036854775807,\"s\":\"\\\"'\"}" },
    .{ .f = 0x3f6e9cc9c7f96d38, .g = 0xb00a4b01f2c9f987, .i = 1, .b = true, .s = "a\x0f\xf0\x9f\x98\x80<", .json = "{\"b\":true,\"f\":0.0037368718183593795,\"g\":-2.838384583666531e-77,\"i\":1,\"s\":\"a\\u000f\xf0\x9f\x98\x80<\"}" },
    .{ .f = 0x70e278f2c1d3fb01, .g = 0xbfaccbc8d144ba57, .i = -7040607129938033833, .b = true, .s = "&\xf0\x9f\x98\x80\x0b\x01\x0f\x1f\x00", .json = "{\"b\":true,\"f\":5.873422197484299e+235,\"g\":-0.05624225191637738,\"i\":-7040607129938033833,\"s\":\"&\xf0\x9f\x98\x80\\u000b\\u0001\\u000f\\u001f\\u0000\"}" },
    .{ .f = 0x40454ccccccccccd, .g = 0x437028c882236d7a, .i = 0, .b = true, .s = "\x1c\x08\x1f\x07&\x06\x04\x05\x12", .json = "{\"b\":true,\"f\":42.6,\"g\":7.277506030880963e+16,\"i\":0,\"s\":\"\\u001c\\b\\u001f\\u0007&\\u0006\\u0004\\u0005\\u0012\"}" },
    .{ .f = 0xc80569f9d2d1f0c2, .g = 0x000ec10c24de9eb3, .i = 9223372036854775807, .b = true, .s = "\x0f\x00\x04&\x0a\xf4\x8f\xbf\xbf\x03 \x14", .json = "{\"b\":true,\"f\":-9.108494753442641e+38,\"g\":2.0518089637971926e-308,\"i\":9223372036854775807,\"s\":\"\\u000f\\u0000\\u0004&\\n\xf4\x8f\xbf\xbf\\u0003 \\u0014\"}" },
};

const golden_fields = [_]Field{
    .{ .name = "b", .kind = .bool },
    .{ .name = "f", .kind = .float },
    .{ .name = "g", .kind = .float },
    .{ .name = "i", .kind = .int },
    .{ .name = "s", .kind = .string },
};

test "golden records from the reference: encode byte-identical, parse back exactly" {
    const gpa = testing.allocator;
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(gpa);
    for (golden_records) |r| {
        const values = [_]Value{
            .{ .bool = r.b },
            .{ .float = @bitCast(r.f) },
            .{ .float = @bitCast(r.g) },
            .{ .int = r.i },
            .{ .string = r.s },
        };
        out.clearRetainingCapacity();
        try encodeRecord(gpa, &out, &golden_fields, &values);
        try testing.expectEqualStrings(r.json, out.items);

        var parsed: [5]Value = undefined;
        var diag: Diagnostic = .{};
        scratch.clearRetainingCapacity();
        try parseRecord(r.json, &golden_fields, &parsed, &scratch, gpa, &diag);
        try testing.expectEqual(r.b, parsed[0].bool);
        try testing.expectEqual(r.f, @as(u64, @bitCast(parsed[1].float)));
        try testing.expectEqual(r.g, @as(u64, @bitCast(parsed[2].float)));
        try testing.expectEqual(r.i, parsed[3].int);
        try testing.expectEqualStrings(r.s, parsed[4].string);
    }
}

test "record layout of the reference example" {
    const gpa = testing.allocator;
    const fields = [_]Field{
        .{ .name = "flag", .kind = .bool },
        .{ .name = "label", .kind = .int },
        .{ .name = "name", .kind = .string },
        .{ .name = "score", .kind = .float },
    };
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    try encodeRecord(gpa, &out, &fields, &.{ .{ .bool = true }, .{ .int = 0 }, .{ .string = "s0" }, .{ .float = 0.0 } });
    try testing.expectEqualStrings("{\"flag\":true,\"label\":0,\"name\":\"s0\",\"score\":0.0}", out.items);
    try testing.expectEqual(@as(usize, 0x2f), out.items.len);
    out.clearRetainingCapacity();
    try encodeRecord(gpa, &out, &.{}, &.{});
    try testing.expectEqualStrings("{}", out.items);
}

test "string escaping matches serde_json" {
    const gpa = testing.allocator;
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    const cases = [_][2][]const u8{
        .{ "", "\"\"" },
        .{ "plain", "\"plain\"" },
        .{ "\"", "\"\\\"\"" },
        .{ "\\", "\"\\\\\"" },
        .{ "\x08\x0c\n\r\t", "\"\\b\\f\\n\\r\\t\"" },
        .{ "\x00\x01\x0b\x0e\x1a\x1f", "\"\\u0000\\u0001\\u000b\\u000e\\u001a\\u001f\"" },
        .{ "/", "\"/\"" },
        .{ "\x7f", "\"\x7f\"" },
        .{ " ", "\" \"" },
        .{ "\u{2028}\u{2029}", "\"\u{2028}\u{2029}\"" },
        .{ "\u{1F600}é中\u{ffff}\u{10ffff}", "\"\u{1F600}é中\u{ffff}\u{10ffff}\"" },
        .{ "a\"b\\c\nd\x01e/f", "\"a\\\"b\\\\c\\nd\\u0001e/f\"" },
    };
    for (cases) |case| {
        out.clearRetainingCapacity();
        try appendString(gpa, &out, case[0]);
        try testing.expectEqualStrings(case[1], out.items);
    }
}

test "ints are plain decimal over the full i64 range" {
    const gpa = testing.allocator;
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    const cases = [_]struct { i64, []const u8 }{
        .{ 0, "0" },                                      .{ -1, "-1" },
        .{ 7, "7" },                                      .{ -10, "-10" },
        .{ std.math.maxInt(i64), "9223372036854775807" }, .{ std.math.minInt(i64), "-9223372036854775808" },
    };
    for (cases) |case| {
        out.clearRetainingCapacity();
        try appendInt(gpa, &out, case[0]);
        try testing.expectEqualStrings(case[1], out.items);
    }
}

/// Parses `json` against `fields`; on success returns null, on failure the diagnostic.
fn tryParse(json: []const u8, fields: []const Field, values: []Value, scratch: *std.ArrayList(u8), diag: *Diagnostic) !bool {
    parseRecord(json, fields, values, scratch, testing.allocator, diag) catch |err| switch (err) {
        error.Invalid => return false,
        error.OutOfMemory => return err,
    };
    return true;
}

const abcf_fields = [_]Field{
    .{ .name = "a", .kind = .int },
    .{ .name = "b", .kind = .int },
    .{ .name = "c", .kind = .string },
    .{ .name = "f", .kind = .float },
};

fn expectParseError(json: []const u8, kind: ErrorKind, message: []const u8) !void {
    var values: [abcf_fields.len]Value = undefined;
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(testing.allocator);
    var diag: Diagnostic = .{};
    if (try tryParse(json, &abcf_fields, &values, &scratch, &diag)) {
        std.debug.print("unexpectedly parsed: {s}\n", .{json});
        return error.TestUnexpectedResult;
    }
    try testing.expectEqualStrings(message, diag.message());
    try testing.expectEqual(kind, diag.kind);
}

fn expectParsed(json: []const u8, expected: [abcf_fields.len]Value) !void {
    var values: [abcf_fields.len]Value = undefined;
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(testing.allocator);
    var diag: Diagnostic = .{};
    if (!try tryParse(json, &abcf_fields, &values, &scratch, &diag)) {
        std.debug.print("failed on {s}: {s}\n", .{ json, diag.message() });
        return error.TestUnexpectedResult;
    }
    for (expected, values) |e, v| {
        try testing.expectEqual(std.meta.activeTag(e), std.meta.activeTag(v));
        switch (e) {
            .float => |x| try testing.expectEqual(@as(u64, @bitCast(x)), @as(u64, @bitCast(v.float))),
            .string => |x| try testing.expectEqualStrings(x, v.string),
            else => try testing.expectEqual(e, v),
        }
    }
}

test "parse: accepted inputs (cases observed with the reference)" {
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.5}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "x" }, .{ .float = 1.5 } });
    // Any key order and whitespace.
    try expectParsed(" {\n \"f\" : 1E2 ,\t\"c\" : \"x\" , \"b\":2,\"a\":1 }\r\n ", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "x" }, .{ .float = 100.0 } });
    // Duplicate keys: the last one wins (serde_json map semantics).
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.5,\"a\":3}", .{ .{ .int = 3 }, .{ .int = 2 }, .{ .string = "x" }, .{ .float = 1.5 } });
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.5,\"\\u0061\":7}", .{ .{ .int = 7 }, .{ .int = 2 }, .{ .string = "x" }, .{ .float = 1.5 } });
    // -0 is the float -0.0 in serde_json; big integer literals are floats.
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":-0}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "x" }, .{ .float = -0.0 } });
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":-0.0e-5}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "x" }, .{ .float = -0.0 } });
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":18446744073709551615}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "x" }, .{ .float = 18446744073709551615.0 } });
    try expectParsed("{\"a\":-9223372036854775808,\"b\":9223372036854775807,\"c\":\"\",\"f\":1e-400}", .{ .{ .int = std.math.minInt(i64) }, .{ .int = std.math.maxInt(i64) }, .{ .string = "" }, .{ .float = 0.0 } });
    // Correctly rounded (the reference gets the last digit wrong on some of these).
    try expectParsed("{\"a\":0,\"b\":0,\"c\":\"x\",\"f\":2.2250738585072011e-308}", .{ .{ .int = 0 }, .{ .int = 0 }, .{ .string = "x" }, .{ .float = 2.2250738585072011e-308 } });
    // Escapes decode, including surrogate pairs; `\/` is `/`.
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"\\ud83d\\ude00\\u00E9\\/\\\"\\\\\\b\\f\\n\\r\\t\\u0000\",\"f\":1.0}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "\u{1F600}é/\"\\\x08\x0c\n\r\t\x00" }, .{ .float = 1.0 } });
    // Raw non-ASCII, DEL and U+2028 are fine.
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"\x7f\u{2028}中\u{10ffff}\",\"f\":1.0}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "\x7f\u{2028}中\u{10ffff}" }, .{ .float = 1.0 } });
    // Deliberate fix: null (the reference's NaN / inf) is accepted in a float field.
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":null}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "x" }, .null });
}

test "parse: schema errors are ValueErrors with the reference's text and order" {
    const v = ErrorKind.invalid_cache;
    try expectParseError("{\"a\":\"1\",\"x\":2,\"c\":\"x\",\"f\":1.5}", v, "embedded metadata field 'a' expected int, got string");
    try expectParseError("{\"a\":1,\"x\":2,\"c\":5,\"f\":1.5}", v, "embedded metadata field 'b' is missing");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":5,\"x\":1.5}", v, "embedded metadata field 'c' expected string, got int");
    try expectParseError("{\"a\":1,\"b\":2.0,\"c\":5,\"f\":1.5}", v, "embedded metadata field 'b' expected int, got float");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":5,\"f\":1.5,\"g\":1}", v, "embedded metadata keys do not match schema");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"a\":1.5}", v, "embedded metadata keys do not match schema");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1}", v, "embedded metadata field 'f' expected float, got int");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":-9223372036854775808}", v, "embedded metadata field 'f' expected float, got int");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":true}", v, "embedded metadata field 'f' expected float, got bool");
    try expectParseError("{\"a\":9223372036854775808,\"b\":2,\"c\":\"x\",\"f\":1}", v, "embedded metadata field 'a' expected int, got float");
    try expectParseError("{\"a\":-9223372036854775809,\"b\":2,\"c\":\"x\",\"f\":1}", v, "embedded metadata field 'a' expected int, got float");
    try expectParseError("{\"a\":18446744073709551616,\"b\":2,\"c\":\"x\",\"f\":1}", v, "embedded metadata field 'a' expected int, got float");
    try expectParseError("{\"a\":1E2,\"b\":2,\"c\":\"x\",\"f\":1}", v, "embedded metadata field 'a' expected int, got float");
    try expectParseError("{\"a\":-0,\"b\":2,\"c\":\"x\",\"f\":-0}", v, "embedded metadata field 'a' expected int, got float");
    try expectParseError("{\"\\u0061\":1,\"b\":2,\"c\":\"x\",\"f\":1}", v, "embedded metadata field 'f' expected float, got int");
    try expectParseError("{}", v, "embedded metadata keys do not match schema");
    // Distinct keys count: duplicated unknown keys count once, like serde_json's map.
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"zz\":1,\"zz\":2}", v, "embedded metadata field 'f' is missing");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"zz\":1,\"z\\u007a\":2}", v, "embedded metadata field 'f' is missing");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"zz\":1,\"zy\":2}", v, "embedded metadata keys do not match schema");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"zz\":1}", v, "embedded metadata field 'f' is missing");
    try expectParseError("{\"a\":true,\"b\":2,\"c\":\"x\",\"f\":null,\"f\":1.0}", v, "embedded metadata field 'a' expected int, got bool");
}

test "parse: JSON errors, with the reference's columns" {
    const j = ErrorKind.json;
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.5,\"g\":null}", j, "data did not match any variant of untagged enum MetadataValue at line 1 column 37");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.5,\"g\":[1]}", j, "data did not match any variant of untagged enum MetadataValue at line 1 column 34");
    try expectParseError("{\"a\":null,\"b\":2,\"c\":\"x\",\"f\":1.5}", j, "data did not match any variant of untagged enum MetadataValue at line 1 column 9");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":{}}", j, "data did not match any variant of untagged enum MetadataValue at line 1 column 26");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1e400}", j, "number out of range at line 1 column 30");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":-1.8e308}", j, "number out of range at line 1 column 33");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\\ud800\",\"f\":1}", j, "unexpected end of hex escape at line 1 column 25");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\\ud800x\",\"f\":1.0}", j, "unexpected end of hex escape at line 1 column 25");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\\ud800\\u0041\",\"f\":1.0}", j, "lone leading surrogate in hex escape at line 1 column 30");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\\udc00\",\"f\":1.0}", j, "lone leading surrogate in hex escape at line 1 column 24");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\\u12G4\",\"f\":1.0}", j, "invalid escape at line 1 column 24");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\\x\",\"f\":1}", j, "invalid escape at line 1 column 20");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\ty\",\"f\":1}", j, "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 20");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1} x", j, "trailing characters at line 1 column 29");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.5}{}", j, "trailing characters at line 1 column 30");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1,}", j, "trailing comma at line 1 column 28");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":01}", j, "invalid number at line 1 column 27");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.}", j, "invalid number at line 1 column 28");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":-}", j, "invalid number at line 1 column 27");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1e}", j, "invalid number at line 1 column 28");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":.5}", j, "expected value at line 1 column 26");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":+1}", j, "expected value at line 1 column 26");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":tru}", j, "expected ident at line 1 column 29");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":nul}", j, "expected ident at line 1 column 29");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\" 1.0}", j, "expected `:` at line 1 column 26");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.0 \"g\":1}", j, "expected `,` or `}` at line 1 column 30");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",f:1.0}", j, "key must be a string at line 1 column 22");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\",\"f\":1.0", j, "EOF while parsing an object at line 1 column 28");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x", j, "EOF while parsing a string at line 1 column 19");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\\u12", j, "EOF while parsing a string at line 1 column 22");
    try expectParseError("{\"a\":", j, "EOF while parsing a value at line 1 column 5");
    try expectParseError("", j, "EOF while parsing a value at line 1 column 0");
    try expectParseError("[1]", j, "invalid type: sequence, expected a map at line 1 column 1");
    try expectParseError("\"x\"", j, "invalid type: string, expected a map at line 1 column 1");
    try expectParseError("x", j, "expected value at line 1 column 1");
    try expectParseError("{\"a\":1,\n\"b\":x}", j, "expected value at line 2 column 5");
    // Invalid UTF-8 is reported at the closing quote, as serde_json does.
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\xff\",\"f\":1}", j, "invalid unicode code point at line 1 column 21");
    try expectParseError("{\"\xff\":1,\"b\":2,\"c\":\"x\",\"f\":1}", j, "invalid unicode code point at line 1 column 4");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"x\xe2\x82\",\"f\":1}", j, "invalid unicode code point at line 1 column 22");
    // Overlong forms, UTF-8-encoded surrogates and code points above U+10FFFF.
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\xc0\xaf\",\"f\":1}", j, "invalid unicode code point at line 1 column 21");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\xed\xa0\x80\",\"f\":1}", j, "invalid unicode code point at line 1 column 22");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\xf4\x90\x80\x80\",\"f\":1}", j, "invalid unicode code point at line 1 column 23");
    // A control character wins over invalid UTF-8 earlier in the same string (serde_json order).
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"\xff\x01\",\"f\":1}", j, "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 20");
    // JSON errors win over schema errors anywhere in the object.
    try expectParseError("{\"a\":\"x\",\"b\":2,\"c\":\"x\",\"f\":1e999}", j, "number out of range at line 1 column 32");
}

test "parse: strings borrow json when unescaped, escaped ones go to scratch" {
    const gpa = testing.allocator;
    const fields = [_]Field{
        .{ .name = "p", .kind = .string },
        .{ .name = "q", .kind = .string },
        .{ .name = "r", .kind = .string },
        .{ .name = "s", .kind = .string },
    };
    var values: [4]Value = undefined;
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(gpa);
    var diag: Diagnostic = .{};

    const plain = "{\"p\":\"one\",\"q\":\"two\",\"r\":\"\",\"s\":\"\u{1F600}\"}";
    try parseRecord(plain, &fields, &values, &scratch, gpa, &diag);
    try testing.expectEqual(@as(usize, 0), scratch.capacity); // no allocation at all
    for (values) |v| {
        const lo = @intFromPtr(plain.ptr);
        try testing.expect(@intFromPtr(v.string.ptr) >= lo and @intFromPtr(v.string.ptr) <= lo + plain.len);
    }
    try testing.expectEqualStrings("two", values[1].string);

    // Existing scratch content is kept; several escaped strings (one long enough to
    // force growth) all stay valid after the parse.
    try scratch.appendSlice(gpa, "previous");
    var long: std.ArrayList(u8) = .empty;
    defer long.deinit(gpa);
    var expected_long: std.ArrayList(u8) = .empty;
    defer expected_long.deinit(gpa);
    for (0..500) |i| {
        try long.appendSlice(gpa, "ab\\n");
        try expected_long.appendSlice(gpa, "ab\n");
        if (i % 7 == 0) {
            try long.appendSlice(gpa, "\\u00e9");
            try expected_long.appendSlice(gpa, "é");
        }
    }
    var json: std.ArrayList(u8) = .empty;
    defer json.deinit(gpa);
    try json.print(gpa, "{{\"s\":\"{s}\",\"r\":\"x\\ty\",\"q\":\"plain\",\"\\u0070\":\"\\\"q\\\"\"}}", .{long.items});
    try parseRecord(json.items, &fields, &values, &scratch, gpa, &diag);
    try testing.expectEqualStrings("\"q\"", values[0].string);
    try testing.expectEqualStrings("plain", values[1].string);
    try testing.expectEqualStrings("x\ty", values[2].string);
    try testing.expectEqualStrings(expected_long.items, values[3].string);
    try testing.expectEqualStrings("previous", scratch.items[0..8]);
    for ([_]usize{ 0, 2, 3 }) |i| {
        const lo = @intFromPtr(scratch.items.ptr);
        try testing.expect(@intFromPtr(values[i].string.ptr) >= lo + 8 and @intFromPtr(values[i].string.ptr) + values[i].string.len <= lo + scratch.items.len);
    }
}

test "parse: bool fields and a schema wider than the stack state buffer" {
    const gpa = testing.allocator;
    const n = 1100;
    const fields = try gpa.alloc(Field, n);
    defer gpa.free(fields);
    const names = try gpa.alloc([6]u8, n);
    defer gpa.free(names);
    const values = try gpa.alloc(Value, n);
    defer gpa.free(values);
    for (fields, names, values, 0..) |*f, *name, *v, i| {
        _ = std.fmt.bufPrint(name, "k{d:0>5}", .{i}) catch unreachable;
        const kind: Kind = @enumFromInt(i % 4);
        f.* = .{ .name = name, .kind = kind };
        v.* = switch (kind) {
            .bool => .{ .bool = i % 8 == 0 },
            .int => .{ .int = @as(i64, @intCast(i)) * -3 },
            .float => .{ .float = @as(f64, @floatFromInt(i)) / 7.0 },
            .string => .{ .string = name },
        };
    }
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    try encodeRecord(gpa, &out, fields, values);
    const parsed = try gpa.alloc(Value, n);
    defer gpa.free(parsed);
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(gpa);
    var diag: Diagnostic = .{};
    try parseRecord(out.items, fields, parsed, &scratch, gpa, &diag);
    for (values, parsed) |a, b| switch (a) {
        .string => |s| try testing.expectEqualStrings(s, b.string),
        else => try testing.expectEqual(a, b),
    };
    // A missing field is still found with the heap state.
    const cut = std.mem.indexOf(u8, out.items, "\"k00001\"").?;
    const end = std.mem.indexOfScalarPos(u8, out.items, cut, ',').?;
    var broken: std.ArrayList(u8) = .empty;
    defer broken.deinit(gpa);
    try broken.appendSlice(gpa, out.items[0..cut]);
    try broken.appendSlice(gpa, "\"k0000x\"");
    try broken.appendSlice(gpa, out.items[cut + 8 .. end]);
    try broken.appendSlice(gpa, out.items[end..]);
    try testing.expectError(error.Invalid, parseRecord(broken.items, fields, parsed, &scratch, gpa, &diag));
    try testing.expectEqualStrings("embedded metadata field 'k00001' is missing", diag.message());
    try testing.expectEqual(ErrorKind.invalid_cache, diag.kind);
}

test "diagnostic messages are truncated at a UTF-8 boundary" {
    var name: [300]u8 = undefined;
    for (0..100) |i| @memcpy(name[i * 3 ..][0..3], "中");
    const fields = [_]Field{.{ .name = &name, .kind = .int }};
    var values: [1]Value = undefined;
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(testing.allocator);
    var diag: Diagnostic = .{};
    try testing.expect(!try tryParse("{\"x\":1}", &fields, &values, &scratch, &diag));
    const msg = diag.message();
    try testing.expect(std.unicode.utf8ValidateSlice(msg));
    try testing.expect(msg.len > 250 and msg.len <= 256);
    try testing.expect(std.mem.startsWith(u8, msg, "embedded metadata field '中中"));
}

/// Random valid UTF-8 mixing every escape class.
fn randomString(random: std.Random, buf: []u8) []const u8 {
    const pieces = [_][]const u8{ "a", "Z", " ", "\"", "\\", "/", "\x00", "\x1f", "\n", "\t", "\x08", "\x7f", "é", "中", "\u{2028}", "\u{1F600}", "\u{10ffff}", "xyz" };
    var len: usize = 0;
    const count = random.uintLessThan(usize, 12);
    for (0..count) |_| {
        const piece = pieces[random.uintLessThan(usize, pieces.len)];
        if (len + piece.len > buf.len) break;
        @memcpy(buf[len..][0..piece.len], piece);
        len += piece.len;
    }
    return buf[0..len];
}

test "property: random finite floats, ints and strings round-trip bit for bit" {
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(0x5eed_f10a7);
    const random = prng.random();
    const fields = [_]Field{
        .{ .name = "f", .kind = .float },
        .{ .name = "i", .kind = .int },
        .{ .name = "s", .kind = .string },
        .{ .name = "t", .kind = .float },
    };
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(gpa);
    var diag: Diagnostic = .{};
    var sbuf: [64]u8 = undefined;
    var checked: usize = 0;
    while (checked < 20000) {
        const f: f64 = @bitCast(random.int(u64));
        if (!std.math.isFinite(f)) continue;
        // Second float: subnormals, integral values and decimal-looking values.
        const t: f64 = switch (checked % 4) {
            0 => @bitCast(random.int(u64) & 0x800f_ffff_ffff_ffff),
            1 => @floatFromInt(random.int(i64) >> random.uintLessThan(u6, 63)),
            2 => @as(f64, @floatFromInt(random.uintLessThan(u32, 1_000_000))) / 1000.0,
            else => random.float(f64) * std.math.pow(f64, 10, @floatFromInt(random.intRangeAtMost(i32, -20, 20))),
        };
        const values = [_]Value{
            .{ .float = f },
            .{ .int = random.int(i64) },
            .{ .string = randomString(random, &sbuf) },
            .{ .float = t },
        };
        out.clearRetainingCapacity();
        scratch.clearRetainingCapacity();
        try encodeRecord(gpa, &out, &fields, &values);
        var parsed: [4]Value = undefined;
        try parseRecord(out.items, &fields, &parsed, &scratch, gpa, &diag);
        try testing.expectEqual(@as(u64, @bitCast(f)), @as(u64, @bitCast(parsed[0].float)));
        try testing.expectEqual(values[1].int, parsed[1].int);
        try testing.expectEqualStrings(values[2].string, parsed[2].string);
        try testing.expectEqual(@as(u64, @bitCast(t)), @as(u64, @bitCast(parsed[3].float)));
        checked += 1;
    }
}

test "fuzz: mutated records never crash the parser" {
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(0xf022);
    const random = prng.random();
    const fields = [_]Field{
        .{ .name = "b", .kind = .bool },
        .{ .name = "f", .kind = .float },
        .{ .name = "i", .kind = .int },
        .{ .name = "s", .kind = .string },
    };
    const interesting = "{}[]\":,\\u0123456789abcdefABCDEF-+.eEtruefalsnl \t\n\r\x00\x1f\x7f\x80\xbf\xc2\xdf\xe0\xed\xef\xf0\xf4\xf5\xff";
    var seed_buf: [64]u8 = undefined;
    var record: std.ArrayList(u8) = .empty;
    defer record.deinit(gpa);
    var mutated: std.ArrayList(u8) = .empty;
    defer mutated.deinit(gpa);
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(gpa);
    var diag: Diagnostic = .{};
    var accepted: usize = 0;
    for (0..30000) |round| {
        record.clearRetainingCapacity();
        const values = [_]Value{
            .{ .bool = random.boolean() },
            .{ .float = @as(f64, @floatFromInt(random.int(i32))) / 8.0 },
            .{ .int = random.int(i64) >> random.uintLessThan(u6, 63) },
            .{ .string = randomString(random, &seed_buf) },
        };
        try encodeRecord(gpa, &record, &fields, &values);
        mutated.clearRetainingCapacity();
        try mutated.appendSlice(gpa, record.items);
        const edits = 1 + random.uintLessThan(usize, 4);
        for (0..edits) |_| {
            const len = mutated.items.len;
            switch (random.uintLessThan(u8, 6)) {
                0 => if (len > 0) {
                    mutated.items[random.uintLessThan(usize, len)] = interesting[random.uintLessThan(usize, interesting.len)];
                },
                1 => if (len > 0) {
                    mutated.items[random.uintLessThan(usize, len)] ^= @as(u8, 1) << random.int(u3);
                },
                2 => try mutated.insert(gpa, random.uintAtMost(usize, len), interesting[random.uintLessThan(usize, interesting.len)]),
                3 => if (len > 0) {
                    _ = mutated.orderedRemove(random.uintLessThan(usize, len));
                },
                4 => mutated.shrinkRetainingCapacity(random.uintAtMost(usize, len)),
                else => if (len > 0) {
                    const from = random.uintLessThan(usize, len);
                    const to = random.uintAtMost(usize, len);
                    var piece: [6]u8 = undefined;
                    const n = @min(len - from, piece.len);
                    @memcpy(piece[0..n], mutated.items[from..][0..n]);
                    try mutated.insertSlice(gpa, to, piece[0..n]);
                },
            }
        }
        // Parse from an exact-size heap copy so any over-read is caught in safe modes.
        const exact = try gpa.dupe(u8, mutated.items);
        defer gpa.free(exact);
        scratch.clearRetainingCapacity();
        var parsed: [4]Value = undefined;
        if (parseRecord(exact, &fields, &parsed, &scratch, gpa, &diag)) {
            accepted += 1;
            try testing.expect(parsed[0] == .bool);
            try testing.expect(parsed[1] == .float or parsed[1] == .null);
            try testing.expect(parsed[2] == .int);
            try testing.expect(std.unicode.utf8ValidateSlice(parsed[3].string));
            // Accepted input re-encodes to something that parses to the same values.
            if (parsed[1] != .null) {
                record.clearRetainingCapacity();
                try encodeRecord(gpa, &record, &fields, &parsed);
                var again: [4]Value = undefined;
                var scratch2: std.ArrayList(u8) = .empty;
                defer scratch2.deinit(gpa);
                try parseRecord(record.items, &fields, &again, &scratch2, gpa, &diag);
                try testing.expectEqualStrings(parsed[3].string, again[3].string);
                try testing.expectEqual(@as(u64, @bitCast(parsed[1].float)), @as(u64, @bitCast(again[1].float)));
            }
        } else |err| switch (err) {
            error.Invalid => {
                try testing.expect(diag.len > 0);
                try testing.expect(std.unicode.utf8ValidateSlice(diag.message()));
            },
            error.OutOfMemory => return err,
        }
        _ = round;
    }
    try testing.expect(accepted > 100);
}

test "fuzz: random bytes never crash the parser" {
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(42);
    const random = prng.random();
    const fields = [_]Field{ .{ .name = "a", .kind = .string }, .{ .name = "b", .kind = .float } };
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(gpa);
    var diag: Diagnostic = .{};
    const alphabet = "{}\"\\u:,ab0123456789.eE-+tnfd \xff\xc3\xa9\x01";
    for (0..20000) |_| {
        const len = random.uintLessThan(usize, 40);
        const buf = try gpa.alloc(u8, len);
        defer gpa.free(buf);
        for (buf) |*c| c.* = alphabet[random.uintLessThan(usize, alphabet.len)];
        if (len > 0) buf[0] = '{';
        scratch.clearRetainingCapacity();
        var parsed: [2]Value = undefined;
        parseRecord(buf, &fields, &parsed, &scratch, gpa, &diag) catch |err| switch (err) {
            error.Invalid => continue,
            error.OutOfMemory => return err,
        };
    }
}

test "utf8Prefix" {
    try testing.expectEqual(@as(usize, 3), utf8Prefix("abc"));
    try testing.expectEqual(@as(usize, 1), utf8Prefix("a\xe4\xb8"));
    try testing.expectEqual(@as(usize, 4), utf8Prefix("a\xe4\xb8\xad"));
    try testing.expectEqual(@as(usize, 1), utf8Prefix("a\xf0\x9f\x98"));
    try testing.expectEqual(@as(usize, 0), utf8Prefix(""));
}

test "long strings: exact reservation and the vectorized runs agree with a naive escaper" {
    const gpa = testing.allocator;
    var prng = std.Random.DefaultPrng.init(7);
    const random = prng.random();
    var text: std.ArrayList(u8) = .empty;
    defer text.deinit(gpa);
    var expected: std.ArrayList(u8) = .empty;
    defer expected.deinit(gpa);
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    for ([_]usize{ 15, 16, 17, 31, 33, 4096, 4097, 20000 }) |len| {
        text.clearRetainingCapacity();
        for (0..len) |_| {
            // Mostly plain runs of varying length, sometimes a byte that needs escaping.
            const c: u8 = if (random.uintLessThan(u8, 20) == 0) random.uintLessThan(u8, 0x20) else if (random.uintLessThan(u8, 40) == 0) '"' else if (random.uintLessThan(u8, 40) == 0) '\\' else random.intRangeAtMost(u8, 0x20, 0x7f);
            try text.append(gpa, c);
        }
        expected.clearRetainingCapacity();
        try expected.append(gpa, '"');
        for (text.items) |c| switch (c) {
            '"' => try expected.appendSlice(gpa, "\\\""),
            '\\' => try expected.appendSlice(gpa, "\\\\"),
            '\n' => try expected.appendSlice(gpa, "\\n"),
            '\r' => try expected.appendSlice(gpa, "\\r"),
            '\t' => try expected.appendSlice(gpa, "\\t"),
            0x08 => try expected.appendSlice(gpa, "\\b"),
            0x0c => try expected.appendSlice(gpa, "\\f"),
            0...0x07, 0x0b, 0x0e...0x1f => try expected.print(gpa, "\\u{x:0>4}", .{c}),
            else => try expected.append(gpa, c),
        };
        try expected.append(gpa, '"');
        out.clearRetainingCapacity();
        try appendString(gpa, &out, text.items);
        try testing.expectEqualStrings(expected.items, out.items);
        if (len > 4096) try testing.expectEqual(expected.items.len, stringBound(text.items));
        // And inside a record, parsed back.
        out.clearRetainingCapacity();
        const fields = [_]Field{.{ .name = "s", .kind = .string }};
        try encodeRecord(gpa, &out, &fields, &.{.{ .string = text.items }});
        var parsed: [1]Value = undefined;
        var scratch: std.ArrayList(u8) = .empty;
        defer scratch.deinit(gpa);
        var diag: Diagnostic = .{};
        try parseRecord(out.items, &fields, &parsed, &scratch, gpa, &diag);
        try testing.expectEqualStrings(text.items, parsed[0].string);
    }
}

test "nextSpecial finds the byte a byte-by-byte scan finds, at every start and length" {
    var prng = std.Random.DefaultPrng.init(17);
    const random = prng.random();
    const alphabet = "ab \"\\\x01\x1f\x7f\x80\xc3\xff~";
    var buf: [48]u8 = undefined;
    for (0..2000) |_| {
        const len = random.uintLessThan(usize, buf.len + 1);
        // Mostly plain bytes, so runs of all lengths occur before a special one.
        for (buf[0..len]) |*b| b.* = if (random.uintLessThan(u8, 8) == 0) alphabet[random.uintLessThan(usize, alphabet.len)] else 'x';
        const json = buf[0..len];
        for (0..len + 1) |start| {
            var want = start;
            while (want < len) : (want += 1) {
                const c = json[want];
                if (c == '"' or c == '\\' or c < 0x20 or c >= 0x80) break;
            }
            try testing.expectEqual(want, nextSpecial(json, start));
        }
    }
}

test "parse: short records whose strings end in the last 16 bytes" {
    // Every key and value ends near the end of the record: the tail scans.
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"\",\"f\":0.5}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "" }, .{ .float = 0.5 } });
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"x\\\"\",\"f\":0.5}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "x\"" }, .{ .float = 0.5 } });
    try expectParsed("{\"a\":1,\"b\":2,\"c\":\"tr\xc3\xa4n\",\"f\":0.5}", .{ .{ .int = 1 }, .{ .int = 2 }, .{ .string = "tr\xc3\xa4n" }, .{ .float = 0.5 } });
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"tra", .json, "EOF while parsing a string at line 1 column 21");
    try expectParseError("{\"a\":1,\"b\":2,\"c\":\"t\x01\"", .json, "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 20");
    try expectParseError("{\"c\":\"ab", .json, "EOF while parsing a string at line 1 column 8");
}

test "eqlShort agrees with std.mem.eql at every length and differing byte" {
    var a: [24]u8 = undefined;
    var b: [24]u8 = undefined;
    for (&a, 0..) |*x, i| x.* = @intCast('a' + i);
    for (0..a.len + 1) |len| {
        @memcpy(b[0..len], a[0..len]);
        try testing.expect(eqlShort(a[0..len], b[0..len]));
        if (len > 0) try testing.expect(!eqlShort(a[0..len], b[0 .. len - 1]));
        for (0..len) |i| {
            b[i] ^= 0x20;
            try testing.expect(!eqlShort(a[0..len], b[0..len]));
            b[i] ^= 0x20;
        }
    }
}
