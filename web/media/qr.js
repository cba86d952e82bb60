/*
 * smp-relay link page: a small QR code encoder (ISO/IEC 18004).
 * Byte mode, UTF-8 text, error-correction level M, versions 1..40.
 * No dependencies and no network access; exposes window.SmpQr = { encode, draw }.
 */
(function () {
  "use strict";

  // Per-version tables for error-correction level M (index 0 unused).
  // Error-correction codewords in each Reed-Solomon block:
  var EC_PER_BLOCK = [0,
    10, 16, 26, 18, 24, 16, 18, 22, 22, 26, 30, 22, 22, 24, 24, 28, 28, 26, 26, 26,
    26, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28, 28];
  // Number of Reed-Solomon blocks the codewords are split into:
  var NUM_BLOCKS = [0,
    1, 1, 1, 2, 2, 4, 4, 4, 5, 5, 5, 8, 9, 9, 10, 10, 11, 13, 14, 16,
    17, 17, 18, 20, 21, 23, 25, 26, 28, 29, 31, 33, 35, 37, 38, 40, 43, 45, 47, 49];

  // ---------------------------------------------------------------------
  // GF(256) arithmetic with the field polynomial x^8+x^4+x^3+x^2+1 (0x11D).
  // EXP holds powers of the generator element 2, LOG their inverse; EXP is
  // doubled in length so a sum of two logs never needs a modulo.
  var EXP = new Uint8Array(512);
  var LOG = new Uint8Array(256);
  (function () {
    var x = 1;
    for (var i = 0; i < 255; i++) {
      EXP[i] = x;
      LOG[x] = i;
      x <<= 1;
      if (x & 0x100) x ^= 0x11d;
    }
    for (i = 255; i < 512; i++) EXP[i] = EXP[i - 255];
  })();

  function gfMul(a, b) {
    return a === 0 || b === 0 ? 0 : EXP[LOG[a] + LOG[b]];
  }

  // The RS generator polynomial of degree n is (x - 2^0)(x - 2^1)...(x - 2^(n-1)).
  // Coefficients are stored highest degree first, so g[0] is always 1.
  var generators = {};
  function generatorPoly(n) {
    if (generators[n]) return generators[n];
    var g = [1];
    for (var i = 0; i < n; i++) {
      var next = new Array(g.length + 1).fill(0);
      for (var j = 0; j < g.length; j++) {
        next[j] ^= g[j];                     // g * x
        next[j + 1] ^= gfMul(g[j], EXP[i]);  // g * 2^i  (minus is xor here)
      }
      g = next;
    }
    generators[n] = g;
    return g;
  }

  // Error-correction codewords: remainder of data(x) * x^n divided by g(x),
  // computed by polynomial long division one data byte at a time.
  function rsRemainder(data, n) {
    var g = generatorPoly(n);
    var rem = new Array(n).fill(0);
    for (var i = 0; i < data.length; i++) {
      var factor = data[i] ^ rem[0];
      rem.shift();
      rem.push(0);
      for (var k = 0; k < n; k++) rem[k] ^= gfMul(g[k + 1], factor);
    }
    return rem;
  }

  // ---------------------------------------------------------------------
  // BCH codes protecting the format and version information.
  // Returns value followed by the remainder of (value << degree) mod poly.
  function bch(value, poly, degree) {
    var rem = value << degree;
    for (var bit = 31; bit >= degree; bit--) {
      if ((rem >>> bit) & 1) rem ^= poly << (bit - degree);
    }
    return (value << degree) | rem;
  }

  // Format information: 2 bits EC level (M = 00), 3 bits mask, BCH(15,5), then
  // xored with 0x5412 so that it is never all zero.
  function formatBits(mask) {
    return bch((0 << 3) | mask, 0x537, 10) ^ 0x5412;
  }

  // Version information (versions 7+): 6 bits version, BCH(18,6).
  function versionBits(version) {
    return bch(version, 0x1f25, 12);
  }

  // ---------------------------------------------------------------------
  // Symbol layout.

  // Centre coordinates of alignment patterns: the first is always 6, the last
  // is size-7, and the rest are evenly spaced (even steps) back from the last.
  function alignmentCentres(version) {
    if (version === 1) return [];
    var size = 17 + 4 * version;
    var count = Math.floor(version / 7) + 2;
    var step = version === 32 ? 26 : 2 * Math.ceil((size - 13) / (2 * (count - 1)));
    var list = [6];
    for (var pos = size - 7; list.length < count; pos -= step) list.splice(1, 0, pos);
    return list;
  }

  // Where the 15 format bits go: bit i is stored at first[i] and second[i]
  // (as [row, col]). One copy wraps the top-left finder, the other is split
  // between the top-right and bottom-left finders.
  function formatPositions(size) {
    var first = [], second = [];
    for (var i = 0; i < 15; i++) {
      if (i < 6) first.push([i, 8]);
      else if (i === 6) first.push([7, 8]);
      else if (i === 7) first.push([8, 8]);
      else if (i === 8) first.push([8, 7]);
      else first.push([8, 14 - i]);
      if (i < 8) second.push([8, size - 1 - i]);
      else second.push([size - 15 + i, 8]);
    }
    return [first, second];
  }

  // Builds a grid with all function patterns in place. `dark` holds module
  // colours, `func` marks modules that are not available for data.
  function baseGrid(version) {
    var size = 17 + 4 * version;
    var grid = { version: version, size: size,
                 dark: new Uint8Array(size * size), func: new Uint8Array(size * size) };
    function set(r, c, isDark) {
      grid.dark[r * size + c] = isDark ? 1 : 0;
      grid.func[r * size + c] = 1;
    }

    // Timing patterns: alternating modules along row 6 and column 6
    // (the finders drawn next overwrite the parts near the corners).
    for (var i = 0; i < size; i++) {
      set(6, i, i % 2 === 0);
      set(i, 6, i % 2 === 0);
    }

    // Finder patterns (7x7 rings: dark, light, 3x3 dark core) plus a light
    // one-module separator, in three corners.
    [[0, 0], [0, size - 7], [size - 7, 0]].forEach(function (corner) {
      for (var dr = -1; dr <= 7; dr++) {
        for (var dc = -1; dc <= 7; dc++) {
          var r = corner[0] + dr, c = corner[1] + dc;
          if (r < 0 || c < 0 || r >= size || c >= size) continue;
          var ring = Math.max(Math.abs(dr - 3), Math.abs(dc - 3));
          set(r, c, ring !== 2 && ring !== 4);
        }
      }
    });

    // Alignment patterns (5x5: dark ring, light ring, dark centre) at every
    // combination of centre coordinates except where a finder sits.
    var centres = alignmentCentres(version), last = centres.length - 1;
    for (var a = 0; a <= last; a++) {
      for (var b = 0; b <= last; b++) {
        if ((a === 0 && b === 0) || (a === 0 && b === last) || (a === last && b === 0)) continue;
        for (var ar = -2; ar <= 2; ar++) {
          for (var ac = -2; ac <= 2; ac++) {
            set(centres[a] + ar, centres[b] + ac, Math.max(Math.abs(ar), Math.abs(ac)) !== 1);
          }
        }
      }
    }

    // Reserve the format-information areas (filled in once the mask is
    // known) and set the single always-dark module beside the bottom-left finder.
    formatPositions(size).forEach(function (copy) {
      copy.forEach(function (p) { set(p[0], p[1], false); });
    });
    set(size - 8, 8, true);

    // Version information: two 6x3 blocks near the top-right and bottom-left
    // finders; bit i sits at (i/3, size-11+i%3) and at the transposed spot.
    if (version >= 7) {
      var vbits = versionBits(version);
      for (i = 0; i < 18; i++) {
        var bitOn = (vbits >>> i) & 1;
        var major = Math.floor(i / 3), minor = size - 11 + (i % 3);
        set(major, minor, bitOn);
        set(minor, major, bitOn);
      }
    }
    return grid;
  }

  // Total codewords a version holds = data modules left over / 8 (any
  // remaining 0..7 modules are "remainder bits", left as zero).
  function totalCodewords(grid) {
    var free = 0;
    for (var i = 0; i < grid.func.length; i++) if (!grid.func[i]) free++;
    return Math.floor(free / 8);
  }

  // ---------------------------------------------------------------------
  // Data encoding.

  // Bit stream: mode 0100 (byte), character count (8 bits for versions 1-9,
  // 16 bits above), the bytes, a terminator of up to four zeros, zero bits to
  // the next byte boundary, then alternating pad bytes 0xEC 0x11.
  function dataCodewords(bytes, version, capacity) {
    var bits = [];
    function put(value, length) {
      for (var i = length - 1; i >= 0; i--) bits.push((value >>> i) & 1);
    }
    put(0x4, 4);
    put(bytes.length, version < 10 ? 8 : 16);
    for (var i = 0; i < bytes.length; i++) put(bytes[i], 8);
    put(0, Math.min(4, capacity * 8 - bits.length));
    while (bits.length % 8) bits.push(0);
    var out = [];
    for (i = 0; i < bits.length; i += 8) {
      var byte = 0;
      for (var j = 0; j < 8; j++) byte = (byte << 1) | bits[i + j];
      out.push(byte);
    }
    for (var pad = 0xec; out.length < capacity; pad ^= 0xec ^ 0x11) out.push(pad);
    return out;
  }

  // Splits data into RS blocks (the shorter blocks come first, longer ones
  // hold one extra data codeword), adds EC codewords to each, and interleaves:
  // the i-th data codeword of every block in turn, then the same for EC.
  function interleave(data, version, total) {
    var numBlocks = NUM_BLOCKS[version], ecLen = EC_PER_BLOCK[version];
    var shortLen = Math.floor(data.length / numBlocks);
    var numLong = data.length % numBlocks;
    var blocks = [], ecBlocks = [], offset = 0;
    for (var b = 0; b < numBlocks; b++) {
      var len = shortLen + (b >= numBlocks - numLong ? 1 : 0);
      var block = data.slice(offset, offset + len);
      offset += len;
      blocks.push(block);
      ecBlocks.push(rsRemainder(block, ecLen));
    }
    var out = [];
    for (var i = 0; i <= shortLen; i++) {
      for (b = 0; b < numBlocks; b++) if (i < blocks[b].length) out.push(blocks[b][i]);
    }
    for (i = 0; i < ecLen; i++) {
      for (b = 0; b < numBlocks; b++) out.push(ecBlocks[b][i]);
    }
    if (out.length !== total) throw new Error("QR: internal codeword count mismatch");
    return out;
  }

  // Places codeword bits (most significant first) in two-module-wide columns,
  // starting at the bottom-right, alternating upwards and downwards, skipping
  // function modules and the vertical timing column.
  function placeData(grid, codewords) {
    var size = grid.size, bit = 0, totalBits = codewords.length * 8, upward = true;
    for (var right = size - 1; right >= 1; right -= 2) {
      if (right === 6) right = 5;
      for (var k = 0; k < size; k++) {
        var row = upward ? size - 1 - k : k;
        for (var dc = 0; dc < 2; dc++) {
          var idx = row * size + right - dc;
          if (grid.func[idx]) continue;
          if (bit < totalBits) grid.dark[idx] = (codewords[bit >>> 3] >>> (7 - (bit & 7))) & 1;
          bit++;
        }
      }
      upward = !upward;
    }
  }

  // ---------------------------------------------------------------------
  // Masking.

  // The eight data-mask conditions (r = row, c = column); true = invert.
  function maskHit(mask, r, c) {
    switch (mask) {
      case 0: return (r + c) % 2 === 0;
      case 1: return r % 2 === 0;
      case 2: return c % 3 === 0;
      case 3: return (r + c) % 3 === 0;
      case 4: return (Math.floor(r / 2) + Math.floor(c / 3)) % 2 === 0;
      case 5: return (r * c) % 2 + (r * c) % 3 === 0;
      case 6: return ((r * c) % 2 + (r * c) % 3) % 2 === 0;
      default: return ((r + c) % 2 + (r * c) % 3) % 2 === 0;
    }
  }

  // Returns a copy of the grid with the mask applied to data modules and the
  // matching format information written into both copies.
  function applyMask(grid, mask) {
    var size = grid.size, dark = grid.dark.slice();
    for (var r = 0; r < size; r++) {
      for (var c = 0; c < size; c++) {
        var idx = r * size + c;
        if (!grid.func[idx] && maskHit(mask, r, c)) dark[idx] ^= 1;
      }
    }
    var fbits = formatBits(mask);
    formatPositions(size).forEach(function (copy) {
      copy.forEach(function (p, i) { dark[p[0] * size + p[1]] = (fbits >>> i) & 1; });
    });
    return dark;
  }

  // Penalty score of one row or column (given as a getter):
  // rule 1: each run of 5+ equal modules costs 3 + (run length - 5);
  // rule 3: each dark 1:1:3:1:1 pattern with four light modules on either
  //         side costs 40 (modules outside the symbol count as light).
  function linePenalty(size, at) {
    var score = 0, run = 1;
    for (var i = 1; i <= size; i++) {
      if (i < size && at(i) === at(i - 1)) { run++; continue; }
      if (run >= 5) score += run - 2;
      run = 1;
    }
    function light(i) { return i < 0 || i >= size || !at(i); }
    var core = [1, 0, 1, 1, 1, 0, 1];
    for (var s = 0; s + 7 <= size; s++) {
      var match = true;
      for (var k = 0; k < 7 && match; k++) match = at(s + k) === core[k];
      if (!match) continue;
      var before = true, after = true;
      for (k = 1; k <= 4; k++) {
        before = before && light(s - k);
        after = after && light(s + 6 + k);
      }
      if (before || after) score += 40;
    }
    return score;
  }

  // Total penalty of a masked symbol (rules 1-4 of the standard).
  function penalty(dark, size) {
    var score = 0, r, c;
    for (r = 0; r < size; r++) {
      score += linePenalty(size, function (i) { return dark[r * size + i]; });
    }
    for (c = 0; c < size; c++) {
      score += linePenalty(size, function (i) { return dark[i * size + c]; });
    }
    // Rule 2: each 2x2 block of one colour costs 3.
    for (r = 0; r + 1 < size; r++) {
      for (c = 0; c + 1 < size; c++) {
        var v = dark[r * size + c];
        if (v === dark[r * size + c + 1] && v === dark[(r + 1) * size + c] &&
            v === dark[(r + 1) * size + c + 1]) score += 3;
      }
    }
    // Rule 4: 10 points per full 5% the dark share deviates from 50%.
    var count = 0;
    for (var i = 0; i < dark.length; i++) count += dark[i];
    score += 10 * Math.floor(Math.abs(count * 100 - dark.length * 50) / (dark.length * 5));
    return score;
  }

  // ---------------------------------------------------------------------
  // Public API.

  // Encodes text into a QR symbol: { size, modules } with modules[row][col]
  // true for dark. Also reports the chosen version and mask.
  function encode(text) {
    var bytes = new TextEncoder().encode(String(text));
    var grid = null, capacity = 0, total = 0;
    for (var v = 1; v <= 40 && !grid; v++) {
      var candidate = baseGrid(v);
      total = totalCodewords(candidate);
      capacity = total - NUM_BLOCKS[v] * EC_PER_BLOCK[v];
      if (4 + (v < 10 ? 8 : 16) + bytes.length * 8 <= capacity * 8) grid = candidate;
    }
    if (!grid) {
      throw new Error("QR: text is too long (" + bytes.length +
                      " UTF-8 bytes; level M holds at most 2331 bytes)");
    }
    var codewords = interleave(dataCodewords(bytes, grid.version, capacity), grid.version, total);
    placeData(grid, codewords);

    // Try all eight masks, scoring each finished symbol (format information
    // included), and keep the one with the lowest penalty.
    var best = null, bestMask = 0, bestScore = Infinity;
    for (var m = 0; m < 8; m++) {
      var masked = applyMask(grid, m);
      var score = penalty(masked, grid.size);
      if (score < bestScore) { best = masked; bestMask = m; bestScore = score; }
    }

    var size = grid.size, modules = [];
    for (var r = 0; r < size; r++) {
      var row = [];
      for (var c = 0; c < size; c++) row.push(best[r * size + c] === 1);
      modules.push(row);
    }
    return { size: size, modules: modules, version: grid.version, mask: bestMask };
  }

  // Draws the QR code for text on a canvas, with a light quiet zone of
  // `margin` modules and `scale` pixels per module.
  function draw(canvas, text, opts) {
    opts = opts || {};
    var scale = opts.scale || 6;
    var margin = opts.margin === undefined ? 4 : opts.margin;
    var qr = encode(text);
    var px = (qr.size + 2 * margin) * scale;
    canvas.width = px;
    canvas.height = px;
    canvas.dataset.modules = String(qr.size);
    var ctx = canvas.getContext("2d");
    ctx.fillStyle = opts.light || "#ffffff";
    ctx.fillRect(0, 0, px, px);
    ctx.fillStyle = opts.dark || "#000000";
    for (var r = 0; r < qr.size; r++) {
      // Draw each horizontal run of dark modules as one rectangle.
      for (var c = 0; c < qr.size; c++) {
        if (!qr.modules[r][c]) continue;
        var start = c;
        while (c + 1 < qr.size && qr.modules[r][c + 1]) c++;
        ctx.fillRect((margin + start) * scale, (margin + r) * scale,
                     (c - start + 1) * scale, scale);
      }
    }
    return qr;
  }

  window.SmpQr = { encode: encode, draw: draw };
})();
