// A tiny highlighter for Python and JavaScript: comments, strings, numbers
// and keywords. It returns [class, text] pairs; the caller renders them as
// text nodes, so nothing from the code is ever parsed as HTML.
const KW = {
  python: new Set('False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case'.split(' ')),
  javascript: new Set('await break case catch class const continue debugger default delete do else export extends false finally for function if import in instanceof let new null of return super switch this throw true try typeof undefined var void while with yield async'.split(' ')),
};

export function highlight(code, lang) {
  const kw = KW[lang] || KW.python;
  const out = [];
  const re = lang === 'javascript'
    ? /(\/\/[^\n]*|\/\*[\s\S]*?\*\/)|(`(?:\\[\s\S]|[^`\\])*`|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")|(\b\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?\b)|([A-Za-z_$][\w$]*)/g
    : /(#[^\n]*)|([rbfu]{0,2}(?:"""[\s\S]*?"""|'''[\s\S]*?'''|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))|(\b\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?j?\b)|([A-Za-z_]\w*)/gi;
  let last = 0;
  for (const m of code.matchAll(re)) {
    if (m.index > last) out.push(['', code.slice(last, m.index)]);
    let cls = '';
    if (m[1]) cls = 'c';
    else if (m[2]) cls = 's';
    else if (m[3]) cls = 'n';
    else if (kw.has(m[4])) cls = 'k';
    out.push([cls, m[0]]);
    last = m.index + m[0].length;
  }
  if (last < code.length) out.push(['', code.slice(last)]);
  return out;
}
