// Vite's `?raw` imports: a file's text (the focus-ring test reads the stylesheet).
declare module '*?raw' {
  const text: string;
  export default text;
}
