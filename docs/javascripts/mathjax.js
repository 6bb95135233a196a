// MathJax 3 settings, read by the bundled javascripts/mathjax/tex-svg-full.js that loads next.
// Typeset pymdownx.arithmatex's output (generic mode: \( \) and \[ \]) and the Markdown cells of
// the example notebooks (rendered by mkdocs-jupyter), which write math as Jupyter does, in $ $.
// An element with any class is skipped with everything inside it, unless the class is one of
// those two; an element without a class goes as its parent does, so the paragraphs and lists
// of a notebook's Markdown cell are typeset and the rest of the page is not.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".+",
    processHtmlClass: "arithmatex|jp-RenderedMarkdown",
  },
};

// Material's instant navigation swaps pages without a reload: typeset each new page.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.typesetPromise) {
      const output = MathJax.startup.output;
      if (output.clearCache) output.clearCache(); // CommonHTML output
      if (output.clearFontCache) output.clearFontCache(); // SVG output
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
