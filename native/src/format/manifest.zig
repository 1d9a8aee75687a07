//! `manifest.json`: parsing (format 2 and 3) and writing (format 3), byte-compatible with
//! dataset-rt 0.4.8 (serde_json pretty output: 2-space indent, fields in a fixed order,
//! no trailing newline). The manifest is a cache's publication marker: it is written last
//! and a directory without one is not a cache.
//!
//! Parsing is strict where the reference is strict (duplicate keys, field types, known
//! compression algorithms, format 2 or 3) and ignores unknown keys. Every name that becomes
//! a file path (shard names) must be a plain path segment, so a crafted manifest cannot
//! make a reader open files outside its cache.

const std = @import("std");
const schema = @import("schema.zig");
const status = @import("../base/status.zig");
const metadata_json = @import("metadata_json.zig");

pub const Compression = enum(i32) {
    none = 0,
    lz4 = 1,

    pub fn name(c: Compression) []const u8 {
        return switch (c) {
            .none => "none",
            .lz4 => "lz4",
        };
    }
};

pub const Shard = struct {
    name: []const u8,
    uncompressed_byte_len: u64,
    byte_len: u64,
    compression: Compression,
    ratio: f64,
    sha256: []const u8,
};

/// A parsed manifest. All slices live in `arena`.
pub const Manifest = struct {
    arena: std.heap.ArenaAllocator,
    format_version: u32,
    /// Stored id (format 3); null for format 2, whose id is the position in the path list.
    cache_id: ?u64,
    source_name: []const u8,
    sample_count: u64,
    fields: []const schema.Field,
    metadata_sha256: []const u8,
    index_sha256: []const u8,
    shards: []const Shard,
    /// This project's extension key: the source's fingerprint, when it had one. The
    /// reference ignores unknown keys, so such caches stay readable by it.
    fingerprint: ?[]const u8 = null,
    /// Top-level keys that are not fields of this format version (including
    /// `fingerprint`, and a `cache_id` in format 2), sorted by key bytes. They take part
    /// in `sameContent` and are carried over by `writeMigrated`, as in the reference;
    /// unknown keys nested in known fields are ignored.
    extras: []const Extra = &.{},

    pub fn deinit(self: *Manifest) void {
        self.arena.deinit();
    }
};

/// An unknown top-level key of a manifest and its JSON value (numbers kept as written).
pub const Extra = struct {
    key: []const u8,
    value: std.json.Value,
};

/// The reference's cache id: the first 8 bytes of SHA-256(name), big-endian, top bit cleared.
pub fn cacheIdForName(source_name: []const u8) u64 {
    var digest: [32]u8 = undefined;
    std.crypto.hash.sha2.Sha256.hash(source_name, &digest, .{});
    return std.mem.readInt(u64, digest[0..8], .big) & 0x7FFF_FFFF_FFFF_FFFF;
}

/// True for a name usable as one path component.
pub fn isPlainSegment(name: []const u8) bool {
    if (name.len == 0) return false;
    if (std.mem.eql(u8, name, ".") or std.mem.eql(u8, name, "..")) return false;
    return std.mem.indexOfAny(u8, name, "/\\\x00") == null;
}

/// The manifest's JSON (duplicate keys refused, numbers kept as written), allocated in
/// `arena`. `path` names the file in error messages.
fn parseJson(arena: std.mem.Allocator, bytes: []const u8, path: []const u8) status.Error!std.json.Value {
    try checkDepth(arena, bytes, path);
    var scanner = std.json.Scanner.initCompleteInput(arena, bytes);
    var diagnostics: std.json.Diagnostics = .{};
    scanner.enableDiagnostics(&diagnostics);
    return std.json.parseFromTokenSourceLeaky(std.json.Value, arena, &scanner, .{
        .duplicate_field_behavior = .@"error",
        .parse_numbers = false,
    }) catch |err| {
        const what: []const u8 = switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            error.DuplicateField => "duplicate manifest field",
            error.UnexpectedEndOfInput => "EOF while parsing a value",
            else => "invalid JSON syntax",
        };
        return status.fail(error.Json, "JSON error: {s} at line {d} column {d} in {s}", .{
            what, diagnostics.getLine(), diagnostics.getColumn(), path,
        });
    };
}

/// Arrays and objects nested this deep are refused, as serde_json (0.4.8's parser)
/// refuses them: a manifest never nests more than four levels.
const nesting_max = 128;

/// Fails with 0.4.8's "JSON error: recursion limit exceeded" when `bytes` nests arrays or
/// objects `nesting_max` deep (a token scan; syntax errors are left to the parse).
fn checkDepth(arena: std.mem.Allocator, bytes: []const u8, path: []const u8) status.Error!void {
    var scanner = std.json.Scanner.initCompleteInput(arena, bytes);
    var diagnostics: std.json.Diagnostics = .{};
    scanner.enableDiagnostics(&diagnostics);
    var depth: usize = 0;
    while (true) {
        const token = scanner.next() catch return;
        switch (token) {
            .object_begin, .array_begin => {
                depth += 1;
                if (depth >= nesting_max) return status.fail(error.Json, "JSON error: recursion limit exceeded at line {d} column {d} in {s}", .{
                    diagnostics.getLine(), diagnostics.getColumn(), path,
                });
            },
            .object_end, .array_end => depth -= 1,
            .end_of_document => return,
            else => {},
        }
    }
}

/// Parses manifest bytes. `path` names the file in error messages.
/// Errors: error.Json ("JSON error: ...") for syntax, types and unknown versions;
/// error.InvalidCache for values that are well-typed but unusable.
pub fn parse(gpa: std.mem.Allocator, bytes: []const u8, path: []const u8) status.Error!Manifest {
    var arena = std.heap.ArenaAllocator.init(gpa);
    errdefer arena.deinit();
    const a = arena.allocator();

    const root = try parseJson(a, bytes, path);
    const object = switch (root) {
        .object => |o| o,
        else => |v| return status.fail(error.Json, "JSON error: invalid type: {s}, expected a manifest object with unique field names at line 1 column 1 in {s}", .{ typeName(v), path }),
    };

    // A missing version is 0.4.8's "requires integer" too (it reads the field untyped).
    const version_value = object.get("format_version") orelse
        return status.fail(error.Json, "JSON error: manifest requires integer format_version in {s}", .{path});
    const version = switch (version_value) {
        .number_string => |s| std.fmt.parseInt(i64, s, 10) catch
            return status.fail(error.Json, "JSON error: manifest requires integer format_version in {s}", .{path}),
        else => return status.fail(error.Json, "JSON error: manifest requires integer format_version in {s}", .{path}),
    };
    if (version != 2 and version != 3) {
        return status.fail(error.Json, "JSON error: unsupported format version {d} in {s}", .{ version, path });
    }

    var cache_id: ?u64 = null;
    if (version == 3) {
        const id_value = object.get("cache_id") orelse
            return status.fail(error.Json, "JSON error: missing field `cache_id` in {s}", .{path});
        cache_id = try getU64(id_value, "cache_id", path);
    }

    const source_name = try getString(try require(object, "source_name", path), "source_name", path);
    const sample_count = try getU64(try require(object, "sample_count", path), "sample_count", path);

    const schema_items = try getArray(try require(object, "metadata_schema", path), "metadata_schema", path);
    const fields = try a.alloc(schema.Field, schema_items.len);
    for (schema_items, fields) |item, *field| {
        const entry = try getObject(item, "metadata_schema entry", path);
        const kind_text = try getString(try require(entry, "kind", path), "kind", path);
        field.* = .{
            .name = try getString(try require(entry, "name", path), "name", path),
            .kind = schema.Kind.fromName(kind_text) orelse
                return status.fail(error.Json, "JSON error: unknown variant `{s}`, expected one of `bool`, `int`, `float`, `string` in {s}", .{ kind_text, path }),
        };
    }

    const metadata_sha256 = try getString(try require(object, "metadata_sha256", path), "metadata_sha256", path);
    const index_sha256 = try getString(try require(object, "index_sha256", path), "index_sha256", path);

    const shard_items = try getArray(try require(object, "shards", path), "shards", path);
    const shards = try a.alloc(Shard, shard_items.len);
    for (shard_items, shards) |item, *shard| {
        const entry = try getObject(item, "shard entry", path);
        const compression_entry = try getObject(try require(entry, "compression", path), "compression", path);
        const algo = try getString(try require(compression_entry, "algo", path), "algo", path);
        const compression: Compression = if (std.mem.eql(u8, algo, "none"))
            .none
        else if (std.mem.eql(u8, algo, "lz4"))
            .lz4
        else
            return status.fail(error.Json, "JSON error: unknown variant `{s}`, expected `none` or `lz4` in {s}", .{ algo, path });
        shard.* = .{
            .name = try getString(try require(entry, "name", path), "name", path),
            .uncompressed_byte_len = try getU64(try require(entry, "uncompressed_byte_len", path), "uncompressed_byte_len", path),
            .byte_len = try getU64(try require(entry, "byte_len", path), "byte_len", path),
            .compression = compression,
            .ratio = try getF64(try require(compression_entry, "ratio", path), "ratio", path),
            .sha256 = try getString(try require(entry, "sha256", path), "sha256", path),
        };
        if (!isPlainSegment(shard.name)) {
            return status.fail(error.InvalidCache, "invalid shard name in {s}: shard names must be plain file names", .{path});
        }
    }

    const fingerprint: ?[]const u8 = if (object.get("fingerprint")) |v| try getString(v, "fingerprint", path) else null;

    // Format 2 has no cache_id field: a `cache_id` key there is an unknown key.
    const known: []const []const u8 = if (version == 3) &field_order else &field_order_v2;
    var extras: std.ArrayList(Extra) = .empty;
    for (object.keys(), object.values()) |key, value| {
        if (!isKnown(known, key)) try extras.append(a, .{ .key = key, .value = value });
    }
    std.mem.sort(Extra, extras.items, {}, struct {
        fn less(_: void, x: Extra, y: Extra) bool {
            return std.mem.order(u8, x.key, y.key) == .lt;
        }
    }.less);

    return .{
        .arena = arena,
        .fingerprint = fingerprint,
        .extras = extras.items,
        .format_version = @intCast(version),
        .cache_id = cache_id,
        .source_name = source_name,
        .sample_count = sample_count,
        .fields = fields,
        .metadata_sha256 = metadata_sha256,
        .index_sha256 = index_sha256,
        .shards = shards,
    };
}

fn typeName(v: std.json.Value) []const u8 {
    return switch (v) {
        .null => "null",
        .bool => "boolean",
        .integer, .float, .number_string => "number",
        .string => "string",
        .array => "sequence",
        .object => "map",
    };
}

fn require(object: std.json.ObjectMap, comptime key: []const u8, path: []const u8) status.Error!std.json.Value {
    return object.get(key) orelse status.fail(error.Json, "JSON error: missing field `" ++ key ++ "` in {s}", .{path});
}

fn getU64(v: std.json.Value, comptime what: []const u8, path: []const u8) status.Error!u64 {
    switch (v) {
        .number_string => |s| return std.fmt.parseInt(u64, s, 10) catch
            status.fail(error.Json, "JSON error: invalid value: {s}, expected u64 for `" ++ what ++ "` in {s}", .{ s, path }),
        .string => |s| return status.fail(error.Json, "JSON error: invalid type: string \"{s}\", expected u64 for `" ++ what ++ "` in {s}", .{ s, path }),
        else => return status.fail(error.Json, "JSON error: invalid type: {s}, expected u64 for `" ++ what ++ "` in {s}", .{ typeName(v), path }),
    }
}

fn getF64(v: std.json.Value, comptime what: []const u8, path: []const u8) status.Error!f64 {
    switch (v) {
        .number_string => |s| return std.fmt.parseFloat(f64, s) catch
            status.fail(error.Json, "JSON error: invalid number {s} for `" ++ what ++ "` in {s}", .{ s, path }),
        else => return status.fail(error.Json, "JSON error: invalid type: {s}, expected f64 for `" ++ what ++ "` in {s}", .{ typeName(v), path }),
    }
}

fn getString(v: std.json.Value, comptime what: []const u8, path: []const u8) status.Error![]const u8 {
    return switch (v) {
        .string => |s| s,
        else => status.fail(error.Json, "JSON error: invalid type: {s}, expected a string for `" ++ what ++ "` in {s}", .{ typeName(v), path }),
    };
}

fn getArray(v: std.json.Value, comptime what: []const u8, path: []const u8) status.Error![]const std.json.Value {
    return switch (v) {
        .array => |arr| arr.items,
        else => status.fail(error.Json, "JSON error: invalid type: {s}, expected a sequence for `" ++ what ++ "` in {s}", .{ typeName(v), path }),
    };
}

fn getObject(v: std.json.Value, comptime what: []const u8, path: []const u8) status.Error!std.json.ObjectMap {
    return switch (v) {
        .object => |o| o,
        else => status.fail(error.Json, "JSON error: invalid type: {s}, expected a map for `" ++ what ++ "` in {s}", .{ typeName(v), path }),
    };
}

/// What the writer knows when it publishes a cache.
pub const WriteInfo = struct {
    source_name: []const u8,
    sample_count: u64,
    fields: []const schema.Field,
    metadata_sha256: [32]u8,
    index_sha256: [32]u8,
    shards: []const WriteShard,
    compression: Compression,
    ratio: f64,
    fingerprint: ?[]const u8 = null,
};

pub const WriteShard = struct {
    uncompressed_byte_len: u64,
    byte_len: u64,
    sha256: [32]u8,
};

/// Shard file name for shard `id` ("000000.bin"; wider ids keep all their digits).
pub fn shardName(buf: *[32]u8, id: u64) []const u8 {
    return std.fmt.bufPrint(buf, "{d:0>6}.bin", .{id}) catch unreachable;
}

/// Appends a format-3 manifest, formatted exactly as dataset-rt 0.4.8 writes it.
pub fn write(gpa: std.mem.Allocator, out: *std.ArrayList(u8), info: WriteInfo) error{OutOfMemory}!void {
    const hex = std.fmt.bytesToHex;
    try out.print(gpa, "{{\n  \"format_version\": 3,\n  \"cache_id\": {d},\n  \"source_name\": ", .{cacheIdForName(info.source_name)});
    try metadata_json.appendString(gpa, out, info.source_name);
    try out.print(gpa, ",\n  \"sample_count\": {d},\n  \"metadata_schema\": ", .{info.sample_count});
    if (info.fields.len == 0) {
        try out.appendSlice(gpa, "[]");
    } else {
        try out.appendSlice(gpa, "[\n");
        for (info.fields, 0..) |field, i| {
            try out.appendSlice(gpa, "    {\n      \"name\": ");
            try metadata_json.appendString(gpa, out, field.name);
            try out.print(gpa, ",\n      \"kind\": \"{s}\"\n    }}", .{field.kind.name()});
            try out.appendSlice(gpa, if (i + 1 < info.fields.len) ",\n" else "\n");
        }
        try out.appendSlice(gpa, "  ]");
    }
    try out.print(gpa, ",\n  \"metadata_sha256\": \"{s}\",\n  \"index_sha256\": \"{s}\",\n  \"shards\": ", .{
        hex(info.metadata_sha256, .lower), hex(info.index_sha256, .lower),
    });
    if (info.shards.len == 0) {
        try out.appendSlice(gpa, "[]");
    } else {
        try out.appendSlice(gpa, "[\n");
        for (info.shards, 0..) |shard, i| {
            var name_buf: [32]u8 = undefined;
            try out.print(gpa, "    {{\n      \"name\": \"{s}\",\n      \"uncompressed_byte_len\": {d},\n      \"byte_len\": {d},\n      \"compression\": {{\n        \"algo\": \"{s}\",\n        \"ratio\": ", .{
                shardName(&name_buf, i), shard.uncompressed_byte_len, shard.byte_len, info.compression.name(),
            });
            try metadata_json.appendFloat(gpa, out, info.ratio);
            try out.print(gpa, "\n      }},\n      \"sha256\": \"{s}\"\n    }}", .{hex(shard.sha256, .lower)});
            try out.appendSlice(gpa, if (i + 1 < info.shards.len) ",\n" else "\n");
        }
        try out.appendSlice(gpa, "  ]");
    }
    if (info.fingerprint) |fp| {
        try out.appendSlice(gpa, ",\n  \"fingerprint\": ");
        try metadata_json.appendString(gpa, out, fp);
    }
    try out.appendSlice(gpa, "\n}");
}

/// Keys of a format-3 manifest in the order they are written; unknown keys follow, sorted.
const field_order = [_][]const u8{ "format_version", "cache_id", "source_name", "sample_count", "metadata_schema", "metadata_sha256", "index_sha256", "shards" };
/// The fields of a format-2 manifest (no cache_id).
const field_order_v2 = [_][]const u8{ "format_version", "source_name", "sample_count", "metadata_schema", "metadata_sha256", "index_sha256", "shards" };

fn isKnown(known: []const []const u8, key: []const u8) bool {
    for (known) |k| {
        if (std.mem.eql(u8, k, key)) return true;
    }
    return false;
}

/// Whether two parsed manifests describe the same cache, as the reference compares a
/// manifest on disk with the one a dataset loaded (update_manifests): every field except
/// `format_version` and a format-3 `cache_id` (typed: `1` and `1.0` are the same ratio),
/// and the unknown top-level keys with serde_json value equality (`1` and `1.0` differ,
/// object key order does not matter). Unknown keys nested in known fields are ignored.
pub fn sameContent(a: *const Manifest, b: *const Manifest) bool {
    if (!std.mem.eql(u8, a.source_name, b.source_name) or a.sample_count != b.sample_count) return false;
    if (!std.mem.eql(u8, a.metadata_sha256, b.metadata_sha256) or !std.mem.eql(u8, a.index_sha256, b.index_sha256)) return false;
    if (a.fields.len != b.fields.len or a.shards.len != b.shards.len) return false;
    for (a.fields, b.fields) |x, y| {
        if (x.kind != y.kind or !std.mem.eql(u8, x.name, y.name)) return false;
    }
    for (a.shards, b.shards) |x, y| {
        if (!std.mem.eql(u8, x.name, y.name) or !std.mem.eql(u8, x.sha256, y.sha256)) return false;
        if (x.uncompressed_byte_len != y.uncompressed_byte_len or x.byte_len != y.byte_len) return false;
        if (x.compression != y.compression or x.ratio != y.ratio) return false;
    }
    // Unknown keys (sorted by key), but a format-2 `cache_id` key next to a format-3
    // manifest: migration made it the field (its value is not compared, as in 0.4.8).
    var i = skipMigratedId(a, b, 0);
    var j = skipMigratedId(b, a, 0);
    while (i < a.extras.len and j < b.extras.len) {
        const x = a.extras[i];
        const y = b.extras[j];
        if (!std.mem.eql(u8, x.key, y.key) or !sameValue(x.value, y.value)) return false;
        i = skipMigratedId(a, b, i + 1);
        j = skipMigratedId(b, a, j + 1);
    }
    return i == a.extras.len and j == b.extras.len;
}

/// `k`, or past it when `m.extras[k]` is a format-2 `cache_id` key and `other` is format 3.
fn skipMigratedId(m: *const Manifest, other: *const Manifest, k: usize) usize {
    if (k < m.extras.len and m.format_version == 2 and other.format_version == 3 and
        std.mem.eql(u8, m.extras[k].key, "cache_id")) return k + 1;
    return k;
}

/// serde_json's number classes: an integer literal that fits u64 (or, negative, i64) is an
/// integer; `-0`, larger integers and literals with a fraction or exponent are floats.
const Number = union(enum) {
    pos: u64,
    neg: i64,
    float: f64,

    fn of(text: []const u8) Number {
        if (std.mem.indexOfAny(u8, text, ".eE") == null and !std.mem.eql(u8, text, "-0")) {
            if (std.fmt.parseInt(u64, text, 10)) |v| return .{ .pos = v } else |_| {}
            if (std.fmt.parseInt(i64, text, 10)) |v| return .{ .neg = v } else |_| {}
        }
        return .{ .float = std.fmt.parseFloat(f64, text) catch std.math.nan(f64) };
    }

    fn eql(x: Number, y: Number) bool {
        return switch (x) {
            .pos => |v| y == .pos and y.pos == v,
            .neg => |v| y == .neg and y.neg == v,
            .float => |v| y == .float and y.float == v,
        };
    }
};

/// serde_json `Value` equality for values parsed with `parse_numbers = false`.
fn sameValue(x: std.json.Value, y: std.json.Value) bool {
    return switch (x) {
        .null => y == .null,
        .bool => |v| y == .bool and y.bool == v,
        .number_string => |v| y == .number_string and Number.of(v).eql(Number.of(y.number_string)),
        .string => |v| y == .string and std.mem.eql(u8, v, y.string),
        .array => |v| y == .array and sameArray(v.items, y.array.items),
        .object => |v| y == .object and sameObject(v, y.object),
        // parseJson keeps numbers as written: these never occur.
        .integer, .float => false,
    };
}

fn sameArray(x: []const std.json.Value, y: []const std.json.Value) bool {
    if (x.len != y.len) return false;
    for (x, y) |p, q| {
        if (!sameValue(p, q)) return false;
    }
    return true;
}

fn sameObject(x: std.json.ObjectMap, y: std.json.ObjectMap) bool {
    if (x.count() != y.count()) return false;
    for (x.keys(), x.values()) |key, value| {
        const other = y.get(key) orelse return false;
        if (!sameValue(value, other)) return false;
    }
    return true;
}

/// Appends `m` as a format-3 manifest with `cache_id`, as the reference writes a migrated
/// manifest: the known fields in order from their parsed values (in the writer's layout),
/// then the unknown top-level keys sorted (a format-2 `cache_id` key is dropped), in
/// serde_json's pretty layout with object keys sorted.
pub fn writeMigrated(gpa: std.mem.Allocator, out: *std.ArrayList(u8), m: *const Manifest, cache_id: u64) error{OutOfMemory}!void {
    try out.print(gpa, "{{\n  \"format_version\": 3,\n  \"cache_id\": {d},\n  \"source_name\": ", .{cache_id});
    try metadata_json.appendString(gpa, out, m.source_name);
    try out.print(gpa, ",\n  \"sample_count\": {d},\n  \"metadata_schema\": ", .{m.sample_count});
    if (m.fields.len == 0) {
        try out.appendSlice(gpa, "[]");
    } else {
        try out.appendSlice(gpa, "[\n");
        for (m.fields, 0..) |field, i| {
            try out.appendSlice(gpa, "    {\n      \"name\": ");
            try metadata_json.appendString(gpa, out, field.name);
            try out.print(gpa, ",\n      \"kind\": \"{s}\"\n    }}", .{field.kind.name()});
            try out.appendSlice(gpa, if (i + 1 < m.fields.len) ",\n" else "\n");
        }
        try out.appendSlice(gpa, "  ]");
    }
    try out.appendSlice(gpa, ",\n  \"metadata_sha256\": ");
    try metadata_json.appendString(gpa, out, m.metadata_sha256);
    try out.appendSlice(gpa, ",\n  \"index_sha256\": ");
    try metadata_json.appendString(gpa, out, m.index_sha256);
    try out.appendSlice(gpa, ",\n  \"shards\": ");
    if (m.shards.len == 0) {
        try out.appendSlice(gpa, "[]");
    } else {
        try out.appendSlice(gpa, "[\n");
        for (m.shards, 0..) |shard, i| {
            try out.appendSlice(gpa, "    {\n      \"name\": ");
            try metadata_json.appendString(gpa, out, shard.name);
            try out.print(gpa, ",\n      \"uncompressed_byte_len\": {d},\n      \"byte_len\": {d},\n      \"compression\": {{\n        \"algo\": \"{s}\",\n        \"ratio\": ", .{
                shard.uncompressed_byte_len, shard.byte_len, shard.compression.name(),
            });
            try metadata_json.appendFloat(gpa, out, shard.ratio);
            try out.appendSlice(gpa, "\n      },\n      \"sha256\": ");
            try metadata_json.appendString(gpa, out, shard.sha256);
            try out.appendSlice(gpa, "\n    }");
            try out.appendSlice(gpa, if (i + 1 < m.shards.len) ",\n" else "\n");
        }
        try out.appendSlice(gpa, "  ]");
    }
    for (m.extras) |extra| {
        if (std.mem.eql(u8, extra.key, "cache_id")) continue;
        try out.appendSlice(gpa, ",\n  ");
        try metadata_json.appendString(gpa, out, extra.key);
        try out.appendSlice(gpa, ": ");
        try writeValue(gpa, out, extra.value, 1);
    }
    try out.appendSlice(gpa, "\n}");
}

pub const Migration = union(enum) {
    /// Already format 3 with the expected cache id: leave the file as it is.
    unchanged,
    /// The new text (owned by the caller's allocator).
    text: []u8,
};

/// Migrates one manifest to format 3 (drt_manifest_migrate): it is parsed as at load
/// (the same errors); a format-2 manifest becomes `writeMigrated`'s text with `cache_id`;
/// a format-3 one must already carry `cache_id`.
/// Errors: those of `parse`; error.InvalidCache ("manifest cache_id changed since
/// dataset construction") when a format-3 manifest's cache_id differs.
pub fn migrate(gpa: std.mem.Allocator, bytes: []const u8, cache_id: u64, path: []const u8) status.Error!Migration {
    var m = try parse(gpa, bytes, path);
    defer m.deinit();
    if (m.format_version == 3) {
        if (m.cache_id.? != cache_id) return status.fail(error.InvalidCache, "manifest cache_id changed since dataset construction", .{});
        return .unchanged;
    }
    var out: std.ArrayList(u8) = .empty;
    errdefer out.deinit(gpa);
    try writeMigrated(gpa, &out, &m, cache_id);
    return .{ .text = try out.toOwnedSlice(gpa) };
}

/// Appends `value` as serde_json's pretty printer writes a `Value` without
/// `preserve_order`: two spaces per level, `[]`/`{}` for empty containers, object keys
/// sorted by bytes, numbers by their serde_json class (`Number`): integers in decimal,
/// floats in serde's shortest form (`-0` is `-0.0`, `1e400` cannot occur: parse refuses it).
fn writeValue(gpa: std.mem.Allocator, out: *std.ArrayList(u8), value: std.json.Value, depth: usize) error{OutOfMemory}!void {
    switch (value) {
        .null => try out.appendSlice(gpa, "null"),
        .bool => |b| try out.appendSlice(gpa, if (b) "true" else "false"),
        .integer => |i| try out.print(gpa, "{d}", .{i}),
        .float => |f| try metadata_json.appendFloat(gpa, out, f),
        .number_string => |n| switch (Number.of(n)) {
            .pos => |v| try out.print(gpa, "{d}", .{v}),
            .neg => |v| try out.print(gpa, "{d}", .{v}),
            .float => |v| try metadata_json.appendFloat(gpa, out, v),
        },
        .string => |t| try metadata_json.appendString(gpa, out, t),
        .array => |items| {
            if (items.items.len == 0) return out.appendSlice(gpa, "[]");
            try out.appendSlice(gpa, "[\n");
            for (items.items, 0..) |item, i| {
                try out.appendNTimes(gpa, ' ', 2 * (depth + 1));
                try writeValue(gpa, out, item, depth + 1);
                try out.appendSlice(gpa, if (i + 1 < items.items.len) ",\n" else "\n");
            }
            try out.appendNTimes(gpa, ' ', 2 * depth);
            try out.append(gpa, ']');
        },
        .object => |o| {
            if (o.count() == 0) return out.appendSlice(gpa, "{}");
            const keys = try gpa.dupe([]const u8, o.keys());
            defer gpa.free(keys);
            std.mem.sort([]const u8, keys, {}, struct {
                fn less(_: void, x: []const u8, y: []const u8) bool {
                    return std.mem.order(u8, x, y) == .lt;
                }
            }.less);
            try out.appendSlice(gpa, "{\n");
            for (keys, 0..) |k, i| {
                try out.appendNTimes(gpa, ' ', 2 * (depth + 1));
                try metadata_json.appendString(gpa, out, k);
                try out.appendSlice(gpa, ": ");
                try writeValue(gpa, out, o.get(k).?, depth + 1);
                try out.appendSlice(gpa, if (i + 1 < keys.len) ",\n" else "\n");
            }
            try out.appendNTimes(gpa, ' ', 2 * depth);
            try out.append(gpa, '}');
        },
    }
}

const testing = std.testing;

test "cache id of src_a matches the reference" {
    try testing.expectEqual(@as(u64, 3522294956285888260), cacheIdForName("src_a"));
}

const fixture_manifest =
    \\{
    \\  "format_version": 3,
    \\  "cache_id": 4233350989699285984,
    \\  "source_name": "plain_one_shard",
    \\  "sample_count": 120,
    \\  "metadata_schema": [
    \\    {
    \\      "name": "flag",
    \\      "kind": "bool"
    \\    },
    \\    {
    \\      "name": "label",
    \\      "kind": "int"
    \\    },
    \\    {
    \\      "name": "name",
    \\      "kind": "string"
    \\    },
    \\    {
    \\      "name": "score",
    \\      "kind": "float"
    \\    }
    \\  ],
    \\  "metadata_sha256": "a453ca5cc2ad343330651fd62e83a48303524f7e33cf2f9e8d5bfe7ab33a9b3f",
    \\  "index_sha256": "59b5eff6df1b27e68ea43cb3483b65b7b10c3de22d5920e6a9f7a169b3e32ce8",
    \\  "shards": [
    \\    {
    \\      "name": "000000.bin",
    \\      "uncompressed_byte_len": 30168,
    \\      "byte_len": 39428,
    \\      "compression": {
    \\        "algo": "none",
    \\        "ratio": 1.0
    \\      },
    \\      "sha256": "546fb049d7ac8fae2358c1a758391091d5ca0237f446809a5efdf5ba342d0c8d"
    \\    }
    \\  ]
    \\}
;

test "parse and rewrite the reference manifest byte for byte" {
    var m = try parse(testing.allocator, fixture_manifest, "m.json");
    defer m.deinit();
    try testing.expectEqual(@as(u32, 3), m.format_version);
    try testing.expectEqual(@as(?u64, 4233350989699285984), m.cache_id);
    try testing.expectEqual(cacheIdForName("plain_one_shard"), m.cache_id.?);
    try testing.expectEqual(@as(usize, 4), m.fields.len);
    try testing.expectEqual(schema.Kind.string, m.fields[2].kind);

    var info: WriteInfo = .{
        .source_name = m.source_name,
        .sample_count = m.sample_count,
        .fields = m.fields,
        .metadata_sha256 = undefined,
        .index_sha256 = undefined,
        .shards = &.{.{ .uncompressed_byte_len = 30168, .byte_len = 39428, .sha256 = undefined }},
        .compression = .none,
        .ratio = 1.0,
    };
    _ = try std.fmt.hexToBytes(&info.metadata_sha256, m.metadata_sha256);
    _ = try std.fmt.hexToBytes(&info.index_sha256, m.index_sha256);
    var shard_sha: [32]u8 = undefined;
    _ = try std.fmt.hexToBytes(&shard_sha, m.shards[0].sha256);
    info.shards = &.{.{ .uncompressed_byte_len = 30168, .byte_len = 39428, .sha256 = shard_sha }};
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(testing.allocator);
    try write(testing.allocator, &out, info);
    try testing.expectEqualStrings(fixture_manifest, out.items);
}

test "manifest errors" {
    const cases = [_]struct { text: []const u8, err: status.Error, prefix: []const u8 }{
        .{ .text = "", .err = error.Json, .prefix = "JSON error: EOF while parsing a value" },
        .{ .text = "{x", .err = error.Json, .prefix = "JSON error: invalid JSON syntax" },
        .{ .text = "[]", .err = error.Json, .prefix = "JSON error: invalid type: sequence, expected a manifest object" },
        .{ .text = "{\"format_version\": 4}", .err = error.Json, .prefix = "JSON error: unsupported format version 4" },
        .{ .text = "{\"format_version\": \"3\"}", .err = error.Json, .prefix = "JSON error: manifest requires integer format_version" },
        .{ .text = "{\"cache_id\": 5}", .err = error.Json, .prefix = "JSON error: manifest requires integer format_version" },
        .{ .text = "{\"format_version\": 3, \"format_version\": 3}", .err = error.Json, .prefix = "JSON error: duplicate manifest field" },
        .{ .text = "{\"format_version\": 3}", .err = error.Json, .prefix = "JSON error: missing field `cache_id`" },
        .{ .text = "{\"format_version\": 3, \"cache_id\": \"5\"}", .err = error.Json, .prefix = "JSON error: invalid type: string \"5\", expected u64" },
        .{ .text = "{\"format_version\": 3, \"cache_id\": -1}", .err = error.Json, .prefix = "JSON error: invalid value: -1, expected u64" },
    };
    for (cases) |case| {
        try testing.expectError(case.err, parse(testing.allocator, case.text, "m.json"));
        try testing.expect(std.mem.startsWith(u8, status.lastMessage(), case.prefix));
    }
    const bad_algo = try std.mem.replaceOwned(u8, testing.allocator, fixture_manifest, "\"none\"", "\"zstd\"");
    defer testing.allocator.free(bad_algo);
    try testing.expectError(error.Json, parse(testing.allocator, bad_algo, "m.json"));
    try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "JSON error: unknown variant `zstd`, expected `none` or `lz4`"));
    const escape = try std.mem.replaceOwned(u8, testing.allocator, fixture_manifest, "000000.bin", "../x.bin");
    defer testing.allocator.free(escape);
    try testing.expectError(error.InvalidCache, parse(testing.allocator, escape, "m.json"));
}

test "format 2 has no cache id and unknown keys are ignored" {
    const v2 = try std.mem.replaceOwned(u8, testing.allocator, fixture_manifest, "\"format_version\": 3", "\"format_version\": 2, \"extra\": [1, {}]");
    defer testing.allocator.free(v2);
    var m = try parse(testing.allocator, v2, "m.json");
    defer m.deinit();
    try testing.expectEqual(@as(?u64, null), m.cache_id);
}

test "fingerprint is written last and read back" {
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(testing.allocator);
    try write(testing.allocator, &out, .{
        .source_name = "s",
        .sample_count = 0,
        .fields = &.{},
        .metadata_sha256 = [_]u8{0} ** 32,
        .index_sha256 = [_]u8{0} ** 32,
        .shards = &.{},
        .compression = .none,
        .ratio = 1.0,
        .fingerprint = "v2 \"quoted\"",
    });
    try testing.expect(std.mem.endsWith(u8, out.items, ",\n  \"fingerprint\": \"v2 \\\"quoted\\\"\"\n}"));
    var m = try parse(testing.allocator, out.items, "m.json");
    defer m.deinit();
    try testing.expectEqualStrings("v2 \"quoted\"", m.fingerprint.?);
}

test "shard names" {
    var buf: [32]u8 = undefined;
    try testing.expectEqualStrings("000000.bin", shardName(&buf, 0));
    try testing.expectEqualStrings("000012.bin", shardName(&buf, 12));
    try testing.expectEqualStrings("1234567.bin", shardName(&buf, 1234567));
}

test "fuzz: mutated manifests parse or fail cleanly" {
    var prng = std.Random.DefaultPrng.init(0x5eed);
    const random = prng.random();
    var buf: [fixture_manifest.len + 16]u8 = undefined;
    for (0..4000) |_| {
        var len: usize = fixture_manifest.len;
        @memcpy(buf[0..len], fixture_manifest);
        for (0..random.intRangeAtMost(usize, 1, 4)) |_| {
            if (len == 0) break;
            switch (random.intRangeAtMost(u8, 0, 3)) {
                0 => buf[random.uintLessThan(usize, len)] ^= @as(u8, 1) << random.int(u3),
                1 => buf[random.uintLessThan(usize, len)] = random.int(u8),
                2 => len = random.uintLessThan(usize, len + 1),
                else => if (len < buf.len) {
                    buf[len] = random.int(u8);
                    len += 1;
                },
            }
        }
        if (parse(testing.allocator, buf[0..len], "m.json")) |parsed| {
            var m = parsed;
            m.deinit();
        } else |err| switch (err) {
            error.Json, error.InvalidCache => try testing.expect(status.lastMessage().len > 0),
            else => return err,
        }
    }
}

test "migrate rewrites format 2 in the reference's layout and leaves format 3 alone" {
    const gpa = testing.allocator;
    // The fixture is format 3: as format 2 (no cache_id, unknown keys, an unknown key
    // nested in a shard) it migrates to the same text plus the unknown top-level keys,
    // sorted and with their objects' keys sorted, with the given id (what 0.4.8 writes).
    var v2: std.ArrayList(u8) = .empty;
    defer v2.deinit(gpa);
    const body_start = std.mem.indexOf(u8, fixture_manifest, "\"source_name\"").?;
    try v2.appendSlice(gpa, "{\"zz\": [1, {\"b\": 2.50, \"a\": {}}], \"format_version\": 2, \"cache_id\": 9, \"n\": -0, \"big\": 18446744073709551616,\n  ");
    try v2.appendSlice(gpa, fixture_manifest[body_start..]);
    const nested = try std.mem.replaceOwned(u8, gpa, v2.items, "\"name\": \"000000.bin\",", "\"name\": \"000000.bin\", \"nested\": 1,");
    defer gpa.free(nested);
    const migrated = try migrate(gpa, nested, 7, "m");
    defer gpa.free(migrated.text);
    const tail_at = std.mem.lastIndexOfScalar(u8, fixture_manifest, '}').?;
    const want = try std.mem.concat(gpa, u8, &.{
        "{\n  \"format_version\": 3,\n  \"cache_id\": 7,\n  ",
        fixture_manifest[body_start .. tail_at - 1],
        ",\n  \"big\": 1.8446744073709552e+19,\n  \"n\": -0.0,\n  \"zz\": [\n    1,\n    {\n      \"a\": {},\n      \"b\": 2.5\n    }\n  ]\n}",
    });
    defer gpa.free(want);
    try testing.expectEqualStrings(want, migrated.text);
    // Format 3 with its id: unchanged; with another id: refused.
    try testing.expectEqual(Migration.unchanged, try migrate(gpa, fixture_manifest, 4233350989699285984, "m"));
    try testing.expectError(error.InvalidCache, migrate(gpa, fixture_manifest, 1, "m"));
    try testing.expectEqualStrings("manifest cache_id changed since dataset construction", status.lastMessage());
    try testing.expectError(error.Json, migrate(gpa, "{\"format_version\": 4}", 1, "m"));
    try testing.expectEqualStrings("JSON error: unsupported format version 4 in m", status.lastMessage());
    try testing.expectError(error.Json, migrate(gpa, "{\"format_version\": \"2\"}", 1, "m"));
    try testing.expectEqualStrings("JSON error: manifest requires integer format_version in m", status.lastMessage());
    try testing.expectError(error.Json, migrate(gpa, "[]", 1, "m"));
    try testing.expectError(error.Json, migrate(gpa, "{\"format_version\": 2, \"format_version\": 2}", 1, "m"));
    try testing.expectError(error.Json, migrate(gpa, "{", 1, "m"));
}

test "sameContent compares fields and unknown keys as the reference does" {
    const gpa = testing.allocator;
    const Case = struct { from: []const u8, to: []const u8, same: bool };
    const cases = [_]Case{
        .{ .from = "\"ratio\": 1.0", .to = "\"ratio\": 1", .same = true },
        .{ .from = "\n  \"shards\"", .to = "\n  \"zz\": {\"a\": 1, \"b\": [2]},\n  \"shards\"", .same = false },
        .{ .from = "\"sample_count\": 120", .to = "\"sample_count\": 121", .same = false },
        .{ .from = "\"source_name\": \"plain_one_shard\"", .to = "\"source_name\": \"plain_one_shard\\u0020\"", .same = false },
        .{ .from = "\"kind\": \"bool\"", .to = "\"kind\": \"int\"", .same = false },
        .{ .from = "\"algo\": \"none\"", .to = "\"algo\": \"none\", \"nested\": 5", .same = true },
        .{ .from = "\"cache_id\": 4233350989699285984", .to = "\"cache_id\": 5", .same = true },
    };
    var base = try parse(gpa, fixture_manifest, "m");
    defer base.deinit();
    for (cases) |case| {
        const text = try std.mem.replaceOwned(u8, gpa, fixture_manifest, case.from, case.to);
        defer gpa.free(text);
        var other = try parse(gpa, text, "m");
        defer other.deinit();
        try testing.expectEqual(case.same, sameContent(&base, &other));
    }
    // Unknown keys: serde_json value equality (1 and 1.0 differ, key order does not).
    const with = struct {
        fn extra(value: []const u8) ![]u8 {
            return std.mem.concat(testing.allocator, u8, &.{ "{\"format_version\": 2, \"zz\": ", value, ",", fixture_manifest[std.mem.indexOf(u8, fixture_manifest, "\"source_name\"").?..] });
        }
    };
    const pairs = [_]struct { []const u8, []const u8, bool }{
        .{ "1", "1.0", false },
        .{ "{\"p\": 1, \"q\": [1, \"x\"]}", "{\"q\": [1, \"x\"], \"p\": 1}", true },
        .{ "2.50", "2.5", true },
        .{ "-0", "0", false },
        .{ "[1, 2]", "[2, 1]", false },
    };
    // A format-2 manifest's `cache_id` key and its migrated form: the same cache (the
    // key became the field), whatever its value; two format-2 manifests compare it.
    {
        const v2 = try with.extra("1");
        defer gpa.free(v2);
        const v2_id = try std.mem.replaceOwned(u8, gpa, v2, "\"zz\": 1,", "\"zz\": 1, \"cache_id\": 77,");
        defer gpa.free(v2_id);
        const v3 = try std.mem.replaceOwned(u8, gpa, v2, "\"format_version\": 2,", "\"format_version\": 3, \"cache_id\": 5,");
        defer gpa.free(v3);
        var old = try parse(gpa, v2_id, "m");
        defer old.deinit();
        var migrated = try parse(gpa, v3, "m");
        defer migrated.deinit();
        var plain = try parse(gpa, v2, "m");
        defer plain.deinit();
        try testing.expect(sameContent(&old, &migrated) and sameContent(&migrated, &old));
        try testing.expect(!sameContent(&old, &plain));
    }
    for (pairs) |pair| {
        const x_text = try with.extra(pair[0]);
        defer gpa.free(x_text);
        const y_text = try with.extra(pair[1]);
        defer gpa.free(y_text);
        var x = try parse(gpa, x_text, "m");
        defer x.deinit();
        var y = try parse(gpa, y_text, "m");
        defer y.deinit();
        try testing.expectEqual(pair[2], sameContent(&x, &y));
    }
}

test "manifests nested as deep as serde_json refuses are refused" {
    const gpa = std.testing.allocator;
    var arena = std.heap.ArenaAllocator.init(gpa);
    defer arena.deinit();
    var deep: [2 * nesting_max + 16]u8 = undefined;
    var n: usize = 0;
    deep[n] = '{';
    n += 1;
    for ("\"x\":") |ch| {
        deep[n] = ch;
        n += 1;
    }
    for (0..nesting_max) |_| {
        deep[n] = '[';
        n += 1;
    }
    try std.testing.expectError(error.Json, checkDepth(arena.allocator(), deep[0..n], "m.json"));
    try std.testing.expect(std.mem.startsWith(u8, status.lastMessage(), "JSON error: recursion limit exceeded at line 1 column "));
    // Shallower nesting (and syntax errors) pass: the parse reports those.
    try checkDepth(arena.allocator(), "{\"x\": [[[1]]], \"y\": {\"z\": []}}", "m.json");
    try checkDepth(arena.allocator(), "{\"x\": [", "m.json");
}
