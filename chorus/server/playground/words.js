// The words of a timed turn (docs/timestamps.md): the WebSocket's `timestamps` events shown as a
// line of words, the one playing highlighted (`aria-current`, and its index in the list's
// `data-current`). Word times are seconds of the turn's audio (a piece's words already start
// after the audio of the pieces before it); the track maps them onto the AudioContext's clock
// through the buffers the page scheduled, so a gap in the stream delays the highlight as it
// delays the audio. A piece's event comes after its audio: a word that played before it came is
// listed but was never highlighted.

export class WordTrack {
  // `list`: the element the words go in; `method`: the output that names their method;
  // `clock`: a function giving the AudioContext's current time.
  constructor(list, method, clock) {
    this.list = list;
    this.method = method;
    this.clock = clock;
    this.words = []; // {span, start, end}, in the order spoken
    this.methods = []; // each piece's method
    this.segments = []; // audio scheduled and not yet played: {at (clock), from (turn), duration}
    this.next = 0; // the first word that has not ended yet
    this.current = -1;
    this.frame = null;
    list.replaceChildren();
    delete list.dataset.current;
    method.textContent = "waiting for the first piece's timings";
    delete method.dataset.method;
  }

  // One `timestamps` event: its piece's words (parallel lists), after those of the pieces before.
  add(event) {
    const { words, start, end } = event.word_timestamps;
    words.forEach((word, i) => {
      const span = document.createElement("span");
      span.className = "word";
      span.textContent = word;
      span.dataset.start = start[i];
      span.dataset.end = end[i];
      this.list.append(...(this.words.length ? [" ", span] : [span]));
      this.words.push({ span, start: start[i], end: end[i] });
    });
    this.methods.push(event.method);
    // a whole HTTP response's rule (docs/timestamps.md): alignment only when every piece was aligned
    const method = this.methods.every((m) => m === "alignment") ? "alignment" : "estimate";
    this.method.dataset.method = method;
    this.method.textContent = method === "alignment" ? "alignment (from the model's attention)"
      : "estimate (from the text alone)";
    this.follow();
  }

  // `duration` seconds of the turn's audio, from `from` on, play at `at` on the clock.
  scheduled(at, from, duration) {
    this.segments.push({ at, from, duration });
    this.follow();
  }

  // Stop following the audio (it was silenced): no word is highlighted.
  stop() {
    if (this.frame !== null) cancelAnimationFrame(this.frame);
    this.frame = null;
    this.segments = [];
    this.highlight(-1);
  }

  follow() {
    if (this.frame === null) this.frame = requestAnimationFrame(() => this.tick());
  }

  tick() {
    this.frame = null;
    const position = this.position();
    if (position === null) {
      this.highlight(-1);
    } else {
      while (this.next < this.words.length && this.words[this.next].end <= position) this.next += 1;
      const word = this.words[this.next];
      this.highlight(word !== undefined && word.start <= position ? this.next : -1);
    }
    if (this.segments.length > 0) this.follow(); // until the last audio scheduled has played
  }

  // Where in the turn's audio the clock is, or null where nothing plays (before the first
  // buffer, in a gap between buffers, after the last).
  position() {
    const now = this.clock();
    while (this.segments.length > 0 && this.segments[0].at + this.segments[0].duration <= now) this.segments.shift();
    const playing = this.segments[0];
    return playing !== undefined && playing.at <= now ? playing.from + (now - playing.at) : null;
  }

  highlight(index) {
    if (index === this.current) return;
    if (this.current >= 0) this.words[this.current].span.removeAttribute("aria-current");
    this.current = index;
    if (index >= 0) {
      this.words[index].span.setAttribute("aria-current", "true");
      this.list.dataset.current = index;
    } else {
      delete this.list.dataset.current;
    }
  }
}
