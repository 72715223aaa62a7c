// sinklib explorer: one front end for the Jupyter widget (anywidget) and the exported page.
// It reads a model with get / set / save_changes / on: the widget's, or staticModel(data) in a page.
// Synced state: header (sinklib.explorer.payload.header), step (asked), shown_step + scores (the step whose
// float32 [layers, heads, seq] scores are here), layer, head, eps, attention + attention_of (a replayed map).

const PLAY_INTERVAL_MS = 600;

function bytesOf(value) {
  if (!value) return new Uint8Array(0);
  if (typeof value === "string") {
    const binary = atob(value);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
}

function floats(value) {
  // copy: a DataView's offset need not be a multiple of 4
  const bytes = bytesOf(value);
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return new Float32Array(copy.buffer);
}

// Eq. 3 as sinklib.find_sinks (sum units): key j is a sink when s_j > mean_{k≠j} s_k + eps; NaN keys are
// invalid (never sinks, outside the mean).
function findSinks(scores, eps) {
  let total = 0;
  let valid = 0;
  for (const s of scores) if (!Number.isNaN(s)) { total += s; valid += 1; }
  return Array.from(scores, (s) => !Number.isNaN(s) && valid > 1 && s - (total - s) / (valid - 1) > eps);
}

function heat(fraction) {
  // white → deep red, perceptually monotone enough for one hue
  const t = Math.max(0, Math.min(1, fraction));
  const r = Math.round(255 - 75 * t), g = Math.round(255 - 230 * t), b = Math.round(255 - 215 * t);
  return `rgb(${r},${g},${b})`;
}

function element(tag, attributes = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "text") node.textContent = value;
    else if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function staticModel(data) {
  // The page's stand-in for the widget model: every step's scores are embedded, so a step change is local.
  const header = data.header;
  const perStep = header.n_layers * header.n_heads * header.seq;
  const all = floats(data.scores);
  const state = { ...data.state, header, attention: null, attention_of: [] };
  const listeners = {};
  const fire = (name) => (listeners[name] || []).forEach((callback) => callback());
  const load = () => {
    state.scores = all.subarray(state.step * perStep, (state.step + 1) * perStep);
    state.shown_step = state.step;
  };
  load();
  return {
    get: (key) => state[key],
    set: (key, value) => {
      state[key] = value;
      if (key === "step") { load(); fire("change:scores"); }
      fire(`change:${key}`);
    },
    save_changes: () => {},
    on: (name, callback) => { (listeners[name] = listeners[name] || []).push(callback); },
  };
}

function render({ model, el }) {
  const header = model.get("header");
  const { n_steps: nSteps, n_layers: nLayers, n_heads: nHeads, seq } = header;
  const mainScore = floats(header.main_score);
  const tokenText = (id) => header.vocab[String(id)] ?? String(id);
  let timer = null;

  const root = element("div", { class: "sinklib-explorer", "data-model": header.model });
  const play = element("button", { "data-role": "play", type: "button", text: "▶ play" });
  const previous = element("button", { "data-role": "previous", type: "button", text: "◀" });
  const next = element("button", { "data-role": "next", type: "button", text: "▶" });
  const slider = element("input", { "data-role": "step", type: "range", min: 0, max: nSteps - 1, value: 0 });
  const stepLabel = element("span", { "data-role": "step-label", class: "label" });
  const eps = element("input", { "data-role": "eps", type: "number", min: 0, step: 0.5, value: model.get("eps") });
  const headLabel = element("span", { "data-role": "head-label", class: "label" });
  const controls = element("div", { class: "controls" }, [
    play, previous, slider, next, stepLabel, element("span", { text: "ε" }), eps, headLabel]);
  const canvas = element("div", { "data-role": "canvas", class: "canvas" });
  const grid = element("table", { "data-role": "grid", class: "grid" });
  const strip = element("div", { "data-role": "strip", class: "strip" });
  const mapCanvas = element("canvas", { "data-role": "attention", class: "attention" });
  const mapCaption = element("div", { "data-role": "attention-caption", class: "caption" });
  root.append(
    element("div", { class: "title", text: `${header.model} · ${nSteps} steps · ${nHeads} heads · ` +
      (header.model_layers > nLayers ? `layers ${header.layer_ids.join(", ")} of ${header.model_layers}` : `${nLayers} layers`) }),
    controls,
    element("div", { class: "caption", text: "canvas: ▢ still masked, yellow = decoded at this step, underlined = sink of the selected head" }),
    canvas,
    element("div", { class: "row" }, [
      element("div", {}, [element("div", { class: "caption", text: "main sink score per layer × head (click a head)" }), grid]),
      element("div", { class: "strip-box" }, [element("div", { "data-role": "strip-caption", class: "caption" }), strip]),
    ]),
    mapCaption, mapCanvas);
  el.append(root);

  // the grid's cells are built once; draw() recolours them
  const cells = [];
  const headRow = element("tr", {}, [element("th", { text: "layer \\ head" })]);
  for (let h = 0; h < nHeads; h++) headRow.append(element("th", { text: String(h) }));
  grid.append(headRow);
  for (let l = 0; l < nLayers; l++) {
    const row = element("tr", {}, [element("th", { text: String(header.layer_ids[l]), title: header.layer_names[l] })]);
    for (let h = 0; h < nHeads; h++) {
      const cell = element("td", { "data-layer": l, "data-head": h, class: "cell" });
      cell.addEventListener("click", () => {
        model.set("layer", l);
        model.set("head", h);
        model.save_changes();
      });
      cells.push(cell);
      row.append(cell);
    }
    grid.append(row);
  }

  const askStep = (step) => {
    const clamped = Math.max(0, Math.min(nSteps - 1, step));
    if (clamped !== model.get("step")) { model.set("step", clamped); model.save_changes(); }
  };
  const stop = () => { clearInterval(timer); timer = null; play.textContent = "▶ play"; };
  play.addEventListener("click", () => {
    if (timer) return stop();
    if (model.get("shown_step") >= nSteps - 1) askStep(0);
    play.textContent = "❚❚ pause";
    timer = setInterval(() => {
      // advance only once the asked step is shown, so a slow kernel never skips steps
      if (model.get("shown_step") !== model.get("step")) return;
      if (model.get("step") >= nSteps - 1) return stop();
      askStep(model.get("step") + 1);
    }, PLAY_INTERVAL_MS);
  });
  previous.addEventListener("click", () => askStep(model.get("step") - 1));
  next.addEventListener("click", () => askStep(model.get("step") + 1));
  slider.addEventListener("input", () => askStep(Number(slider.value)));
  eps.addEventListener("change", () => {
    const value = Number(eps.value);
    if (Number.isFinite(value) && value >= 0) { model.set("eps", value); model.save_changes(); }
    else eps.value = model.get("eps");
  });

  function draw() {
    const step = model.get("shown_step");
    const layer = model.get("layer");
    const head = model.get("head");
    const all = floats(model.get("scores"));
    const scores = all.subarray((layer * nHeads + head) * seq, (layer * nHeads + head + 1) * seq);
    const sinks = findSinks(scores, model.get("eps"));
    slider.value = model.get("step");
    // a cached sampler's step computed only a window of queries (Trace.recomputed); its scores sum over those rows
    const window = header.recomputed ? header.recomputed[step] : null;
    const first = window ? window.indexOf(1) : -1;
    const cached = window && window.includes(0)
      ? ` · cached: queries ${first}–${window.lastIndexOf(1)} recomputed, the rest reused` : "";
    stepLabel.textContent = `step ${step} / ${nSteps - 1}${cached}`;
    stepLabel.dataset.step = step;
    headLabel.textContent = `layer ${header.layer_ids[layer]} · head ${head}`;
    headLabel.dataset.layer = layer;
    headLabel.dataset.head = head;

    canvas.replaceChildren();
    const masked = header.masked[step];
    for (let p = 0; p < seq; p++) {
      const decodedNow = header.decoded_at[p] === step;
      let text = tokenText(header.canvas[step][p]);
      const classes = ["token"];
      if (p < header.prompt_len) classes.push("prompt");
      if (decodedNow) { text = tokenText(header.canvas[step + 1][p]); classes.push("decoded"); }
      else if (masked[p]) { text = "▢"; classes.push("masked"); }
      if (sinks[p]) classes.push("sink");
      canvas.append(element("span", { class: classes.join(" "), "data-position": p, title: `position ${p}`, text }));
    }

    for (const cell of cells) {
      const l = Number(cell.dataset.layer), h = Number(cell.dataset.head);
      const index = (step * nLayers + l) * nHeads + h;
      const position = header.main_position[step][l][h];
      cell.style.background = heat(mainScore[index] / header.score_max);
      cell.textContent = String(position);
      cell.title = `layer ${header.layer_ids[l]}, head ${h}: main sink at position ${position} ` +
        `(${tokenText(header.canvas[step][position])}), score ${mainScore[index].toFixed(2)}`;
      cell.classList.toggle("selected", l === layer && h === head);
    }

    strip.replaceChildren();
    let top = 0;
    for (const s of scores) if (!Number.isNaN(s)) top = Math.max(top, s);
    const sinkPositions = [];
    for (let p = 0; p < seq; p++) {
      const s = scores[p];
      const bar = element("div", { class: "bar", style: { height: `${Number.isNaN(s) || top === 0 ? 0 : (70 * s) / top}px` } });
      const column = element("div", {
        class: `column${sinks[p] ? " sink" : ""}${Number.isNaN(s) ? " absent" : ""}`,
        "data-position": p, title: `position ${p}: ${Number.isNaN(s) ? "not visible at this step" : s.toFixed(3)}`,
      }, [bar, element("div", { class: "tick", text: masked[p] ? "▢" : tokenText(header.canvas[step][p]) })]);
      if (sinks[p]) sinkPositions.push(p);
      strip.append(column);
    }
    strip.dataset.sinks = sinkPositions.join(",");
    el.querySelector("[data-role=strip-caption]").textContent =
      `score per key (Σ over queries) at step ${step}, layer ${header.layer_ids[layer]}, head ${head}; red: Eq. 3 ` +
      `sinks at ε = ${model.get("eps")}: ${sinkPositions.length ? `positions ${sinkPositions.join(", ")}` : "none"}`;

    drawMap(step, layer, head);
  }

  function drawMap(step, layer, head) {
    const of = model.get("attention_of") || [];
    if (!model.get("attention") && !of.length) {
      mapCaption.textContent = "attention maps are replayed by the model in the notebook (not stored, not in this page)";
      mapCanvas.style.display = "none";
      return;
    }
    const current = of[0] === step && of[1] === layer && of[2] === head;
    mapCanvas.style.display = current ? "" : "none";
    mapCaption.textContent = current
      ? `attention map (queries ↓ × keys →) at step ${step}, layer ${header.layer_ids[layer]}, head ${head}, replayed`
      : "replaying the attention map…";
    if (!current) return;
    const [rows, keys] = [of[3], of[4]];
    const values = floats(model.get("attention"));
    const pixel = Math.max(2, Math.min(8, Math.floor(480 / Math.max(rows, keys))));
    mapCanvas.width = keys * pixel;
    mapCanvas.height = rows * pixel;
    const context = mapCanvas.getContext("2d");
    for (let q = 0; q < rows; q++) {
      for (let k = 0; k < keys; k++) {
        context.fillStyle = heat(Math.sqrt(values[q * keys + k]));
        context.fillRect(k * pixel, q * pixel, pixel, pixel);
      }
    }
  }

  let pending = false;
  const schedule = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  };
  for (const name of ["scores", "shown_step", "step", "layer", "head", "eps", "attention", "attention_of"]) {
    model.on(`change:${name}`, schedule);
  }
  draw();
  return () => stop();
}

export default { render };
