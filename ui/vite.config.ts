/// <reference types="vitest/config" />
import { defineConfig } from 'vite';

// `npm run dev` proxies /api to a running `bumblehive serve`; set BUMBLEHIVE_URL to its address.
const env = (globalThis as { process?: { env: Record<string, string | undefined> } }).process?.env ?? {};
const server = env.BUMBLEHIVE_URL ?? 'http://127.0.0.1:7700';

export default defineConfig({
  // Relative asset paths: the same build loads from Tauri's custom protocol and from any HTTP path.
  base: './',
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2021',
    sourcemap: false,
    // One bundle read from local disk (Tauri's protocol or `serve`), 71 kB gzipped at
    // 217 kB: the warning is a budget to notice growth, not a network concern.
    chunkSizeWarningLimit: 256,
  },
  server: {
    proxy: { '/api': { target: server, changeOrigin: true } },
  },
  test: {
    environment: 'jsdom',
    include: ['src/**/*.test.{ts,tsx}'],
    // The stylesheet is read as text by the focus-ring test (`styles.css?raw`).
    css: { include: [/styles\.css/] },
  },
});
