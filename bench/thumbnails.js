// sharp's side of bench/thumbnails.py (not a benchmark on its own).
//
//   node bench/thumbnails.js OUT_DIR PARALLEL FILE...
//
// The same work as hypermedia's image-thumbnail:v1 profile: turn by EXIF
// orientation, 200x200 cover (centre crop), WebP quality 85, metadata
// stripped (sharp's default), libvips' cache off, one libvips thread per
// image (sharp.concurrency(1)) and PARALLEL images in flight.  Prints one line
// of JSON: seconds from the first image's start to the last one's end, the
// images and bytes written, and the process's peak RSS (VmHWM) and its RSS at
// start (node and sharp loaded, no image yet).
'use strict';

const fs = require('fs');
const path = require('path');
const sharp = require('sharp');

function vmHwmMb() {
  const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) / 1024 : process.memoryUsage().rss / 1048576;
}

async function main() {
  const [outDir, parallelArg, ...files] = process.argv.slice(2);
  const parallel = Number(parallelArg);
  sharp.concurrency(1);
  sharp.cache(false);
  const baseMb = process.memoryUsage().rss / 1048576;
  let next = 0;
  let bytes = 0;
  const sizes = new Set();
  async function lane() {
    while (next < files.length) {
      const i = next++;
      const out = path.join(outDir, `thumb-${i}.webp`);
      const info = await sharp(files[i], { failOn: 'error' })
        .rotate()
        .resize(200, 200, { fit: 'cover', position: 'centre' })
        .webp({ quality: 85 })
        .toFile(out);
      bytes += info.size;
      sizes.add(`${info.width}x${info.height}`);
    }
  }
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: parallel }, lane));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(
    JSON.stringify({
      seconds,
      images: files.length,
      bytes,
      sizes: [...sizes],
      peak_rss_mb: vmHwmMb(),
      base_rss_mb: baseMb,
      sharp: sharp.versions.sharp,
      libvips: sharp.versions.vips,
    }),
  );
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
