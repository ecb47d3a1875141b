/* tracegen_text.c — text -> domain for the trace generator: a fixed,
 * hand-written style classifier (see eldr_tracegen_text_domain). Pure: no
 * state, no allocation. */
#include <ctype.h>
#include <string.h>

#include "eldr/tracegen.h"

enum { ARCH_CODE, ARCH_MATH, ARCH_PROSE, ARCH_WEB, ARCH_ENCYC, ARCH_CHAT, ARCH_INTL, N_ARCH };

static int word_in(const char *w, size_t n, const char *const *list) {
  for (size_t i = 0; list[i]; i++)
    if (strlen(list[i]) == n && !memcmp(list[i], w, n)) return 1;
  return 0;
}

int eldr_tracegen_text_domain(const char *text, size_t len, size_t n_domains) {
  if (n_domains <= 1 || !text) return 0;
  static const char *const code_w[] = {"int", "def", "import", "void", "include", "elif",
                                       "struct", "null", "println", "var", "self", "std",
                                       "printf", "namespace", "endif", "bool", "args", "len",
                                       "nil", "func", "typedef", "enum", "const", "char",
                                       "sizeof", "malloc", "async", "await", "lambda", NULL};
  static const char *const math_w[] = {"theorem", "lemma", "proof", "equation", "let",
                                       "we", "where", "function", "prove", "hence",
                                       "thus", "model", "paper", "results", "show",
                                       "frac", "begin", "end", "mathbb", "alpha", NULL};
  static const char *const prose_w[] = {"he", "she", "his", "her", "said", "him",
                                        "was", "had", "looked", "eyes", "back", "could",
                                        "didn", "don", "felt", "thought", "into", NULL};
  static const char *const web_w[] = {"you", "your", "our", "we", "free", "click",
                                      "online", "best", "get", "more", "new", "can",
                                      "will", "shop", "home", "service", "price", NULL};
  static const char *const enc_w[] = {"was", "born", "county", "american", "known", "served",
                                      "located", "references", "university", "album",
                                      "species", "century", "population", "district",
                                      "released", "film", "team", "season", "league", "river",
                                      "city", "village", "national", "became", NULL};
  static const char *const chat_w[] = {"what", "how", "why", "can", "please", "explain",
                                       "write", "help", "tell", "me", "i", "my", "could",
                                       "would", NULL};
  double sc[N_ARCH] = {0};
  size_t words = 0, braces = 0, semis = 0, latex = 0, quotes = 0, digits = 0, qmarks = 0,
         newlines = 0, nonascii = 0;
  char w[32];
  size_t wn = 0;
  for (size_t i = 0; i <= len; i++) {
    unsigned char c = i < len ? (unsigned char)text[i] : ' ';
    if (isalpha(c)) {
      if (wn < sizeof w) w[wn] = (char)tolower(c);
      wn++;
      continue;
    }
    if (wn) {
      if (wn <= sizeof w) {
        words++;
        if (word_in(w, wn, code_w)) sc[ARCH_CODE] += 1;
        if (word_in(w, wn, math_w)) sc[ARCH_MATH] += 1;
        if (word_in(w, wn, prose_w)) sc[ARCH_PROSE] += 1;
        if (word_in(w, wn, web_w)) sc[ARCH_WEB] += 1;
        if (word_in(w, wn, enc_w)) sc[ARCH_ENCYC] += 1;
        if (word_in(w, wn, chat_w)) sc[ARCH_CHAT] += 1;
      }
      wn = 0;
    }
    switch (c) {
    case '{': case '}': case '=': case '<': case '>': case '[': case ']':
      braces++;
      break;
    case ';': semis++; break;
    case '\\': case '$': case '^': latex++; break;
    case '"': quotes++; break;
    case '?': qmarks++; break;
    case '\n': newlines++; break;
    default:
      if (isdigit(c)) digits++;
      /* UTF-8 lead bytes of letters outside ASCII (not 0xE2: punctuation
       * such as curly quotes and dashes) */
      if (c >= 0xC2 && c != 0xE2) nonascii++;
    }
  }
  double nw = words ? (double)words : 1.0;
  /* braces in LaTeX-heavy text are maths, not code */
  double code_p = (double)braces + 3.0 * (double)semis - 2.0 * (double)latex;
  sc[ARCH_CODE] += code_p > 0 ? code_p : 0;
  sc[ARCH_MATH] += 3.0 * (double)latex;
  sc[ARCH_PROSE] += 1.0 * (double)quotes;
  sc[ARCH_ENCYC] += 0.3 * (double)digits;
  sc[ARCH_CHAT] += 3.0 * (double)qmarks;
  sc[ARCH_INTL] += 1.5 * (double)nonascii;
  (void)nw;
  (void)newlines;
  int best = ARCH_WEB; /* default: generic web text */
  double bv = sc[ARCH_WEB];
  for (int a = 0; a < N_ARCH; a++)
    if (sc[a] > bv) {
      bv = sc[a];
      best = a;
    }
  return (int)((size_t)best % n_domains);
}
