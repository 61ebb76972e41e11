// faste-mm search page: plain JavaScript, no dependencies, no network beyond this server.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { image: null, results: null, options: null, key: sessionStorage.getItem("faste-mm-key") || "" };

function headers() {
  return state.key ? { Authorization: "Bearer " + state.key } : {};
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...headers(), ...(options.headers || {}) } });
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    const message = (body && body.error && body.error.message) || response.statusText || "request failed";
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return body;
}

function showBanner(message, kind = "error", askKey = false) {
  $("banner").hidden = false;
  $("banner").className = "banner " + kind;
  $("banner-text").textContent = message;
  $("key-form").hidden = !askKey;
  if (askKey) $("key").focus();
}

function hideBanner() { $("banner").hidden = true; }

function failed(error, what) {
  if (error.status === 401) {
    showBanner("This server needs an API key.", "error", true);
  } else {
    showBanner(`${what} failed${error.status ? " (" + error.status + ")" : ""}: ${error.message}`);
  }
}

// ---- the controls: the declared search options (GET /search/options) ---------------------------
// k, the modes, the orders and the kinds, with their defaults, are the server's declarations
// (faste_mm/retrieval/search_request.py); the page only names them. A choice without a name here
// shows as declared.
const LABELS = {
  mode: { dense: "meaning", lexical: "words", hybrid: "both" },
  sort: { relevance: "Best match", "-date": "Newest first", date: "Oldest first" },
  type: { image: "Images", pdf: "PDF pages", video: "Videos", text: "Notes" },
};

async function loadOptions() {
  try {
    const declared = await api("/search/options");
    state.options = declared.options;
    for (const [id, name] of [["mode", "mode"], ["f-sort", "sort"], ["f-type", "type"]]) {
      for (const value of declared.options[name].choices) addChoice($(id), value, LABELS[name][value] || value);
    }
    for (const k of declared.page.k) addChoice($("k"), String(k), String(k));
    $("mode").value = defaultOf("mode");
    $("f-sort").value = defaultOf("sort");
    $("k").value = String(defaultOf("k"));
    return true;
  } catch (error) {
    failed(error, "Loading the search options");
    return false;
  }
}

function defaultOf(name) { return state.options[name].default; }

function addChoice(select, value, label) {
  const option = document.createElement("option");
  option.value = value;
  option.textContent = label;
  select.append(option);
}

// k from a shared link: any number of results within the declared bounds, added to the menu
// (in order) when it is not one of its choices; else the declared default.
function selectK(text) {
  const k = Number(text), { min, max } = state.options.k;
  if (!(text && Number.isInteger(k) && k >= min && k <= max)) { $("k").value = String(defaultOf("k")); return; }
  if (![...$("k").options].some((o) => o.value === String(k))) {
    const later = [...$("k").options].find((o) => Number(o.value) > k);
    addChoice($("k"), String(k), String(k));
    if (later) $("k").insertBefore($("k").lastElementChild, later);
  }
  $("k").value = String(k);
}

// ---- collection header ------------------------------------------------------------------------
async function loadInfo() {
  try {
    const info = await api("/info");
    const col = info.collection;
    if (!col) {
      $("collection").textContent = "embeddings only";
      showBanner("This server has no collection to search. Start it with: faste-mm serve -c NAME", "info");
      return info;
    }
    $("collection").innerHTML = "";
    const name = document.createElement("strong");
    name.textContent = col.name;
    const detail = document.createElement("span");
    detail.textContent = `${col.items.toLocaleString()} items · ${shortModel(info.model)} · ${info.dim}-d`;
    const plan = document.createElement("small");  // the receipt: what faste-mm plan measured, or "not measured"
    plan.className = "plan";
    plan.textContent = `plan: ${col.plan}`;
    $("collection").append(name, detail, plan);
    $("rerank-toggle").hidden = !info.reranker;  // only a server started with --rerank can rerank
    // on by default where searches rerank by default: the collection records a reranker
    $("rerank").checked = Boolean(info.reranker && info.collection && info.collection.reranker);
    if (info.reranker) {  // the depth the server reranks a search to (/info), not a number of the page's own
      $("rerank-toggle").title = `Re-score the top ${info.reranker.search_top} hits with ${shortModel(info.reranker.model)}`;
    }
    if (col.items === 0) {
      showBanner(`The collection "${col.name}" is empty. Index some files first: faste-mm index ./photos -c ${col.name}`, "info");
    }
    return info;
  } catch (error) {
    failed(error, "Loading the collection");
    return null;
  }
}

function shortModel(model) {
  const parts = String(model).split("/").filter(Boolean);
  return parts[parts.length - 1] || model;
}

// ---- searching ---------------------------------------------------------------------------------
// ---- filters: the API's type, path, where, date range, order and minimum score ------------------
// "camera~pixel, rating>=4, tag=invoice": each condition goes to the server as written; it reads
// them as the CLI's --where does (facts read from the files, or metadata KEY=VALUE).
function parseWhere(text) {
  return text.split(/[,\n]/).map((part) => part.trim()).filter(Boolean);
}

function minScore() {
  // a cosine with the query: a search by words embeds no query, so the slider does not apply to it
  const words = $("mode").value === "lexical";
  $("f-min").disabled = words;
  const value = Number($("f-min").value);
  $("f-min-value").textContent = words ? "n/a" : value > 0 ? value.toFixed(2) : "off";
  return !words && value > 0 ? value : null;
}

function filters() {
  const type = $("f-type").value;
  const path = $("f-path").value.trim();
  const where = parseWhere($("f-where").value);
  const since = $("f-since").value || null;
  const until = $("f-until").value || null;
  const sort = $("f-sort").value;
  const min_score = minScore();
  const active = Boolean(type || path || where.length || since || until || sort !== defaultOf("sort") || min_score);
  $("filters").classList.toggle("active", active);
  $("f-clear").hidden = !active;
  return { type: type || null, path: path || null, where: where.length ? where : null, since, until, sort, min_score };
}

// A hit's facts in one line: the date taken (as recorded; for a photo or video without one "no
// date", never its file's mtime), the place, the camera.
function factsLine(facts, kind) {
  if (!facts) return "";
  const parts = [];
  if (facts.taken) parts.push(facts.taken.slice(0, 10));
  else if (kind === "image" || kind === "video") parts.push("no date");
  if (facts.place) parts.push(facts.place);
  if (facts.camera) parts.push(facts.camera);
  return parts.join(" · ");
}

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error("cannot read the image file"));
    reader.readAsDataURL(file);
  });
}

// The grid shows the latest search asked for: a new search aborts the one still in flight, and a
// reply that arrives for a superseded search anyway is dropped. Filters changed one after another
// (dates, then the order, then a place) must never leave an earlier request's hits under the later
// request's URL and controls.
let latestSearch = null;  // the AbortController of the search whose reply the grid waits for

// `asked`: a search again after an understood part was removed ({query, text, parts}: the parts
// kept): the words sent literal, the kept parts as filters (`understoodFilters`).
// `crop`: with `id`, a search by that region of the item's picture ([x, y, w, h] in its pixels).
async function search({ id = null, pushUrl = true, asked = null, crop = null } = {}) {
  const q = $("q").value.trim();
  const k = Number($("k").value);
  if (!q && !state.image && id === null) { $("q").focus(); return; }
  hideBanner();
  let body;
  try {
    body = { k, mode: $("mode").value, ...filters() };
    if (!$("rerank-toggle").hidden && id === null) body.rerank = $("rerank").checked;
    if ($("literal").checked) body.literal = true;
    if (asked) Object.assign(body, understoodFilters(body, asked.parts), { literal: true });
    if (id !== null && crop) body.crop = crop;
  } catch (error) {
    showBanner(error.message);
    return;
  }
  if (pushUrl) updateUrl(id, q, String(k), body);
  if (latestSearch) latestSearch.abort();
  const mine = new AbortController();
  latestSearch = mine;
  document.body.classList.add("busy");
  $("go").disabled = true;
  try {
    if (id !== null) {
      body.id = id;
    } else {
      if (q) body.query = asked ? asked.text || q : q;
      if (state.image) body.image = await readAsDataUrl(state.image);
    }
    const result = await api("/search", { method: "POST", body: JSON.stringify(body), signal: mine.signal,
                                           headers: { "Content-Type": "application/json" } });
    if (latestSearch !== mine) return;  // superseded while its reply was on the way
    state.results = result;
    render(result, id === null ? describe(q) : body.crop ? `a region of #${id}` : `items like #${id}`,
           activeFilters(body));
    showUnderstood(asked || (result.query && result.query.understood));
  } catch (error) {
    if (latestSearch === mine) failed(error, "Search");  // an aborted, superseded search says nothing
  } finally {
    if (latestSearch === mine) {  // the later search clears "busy" when its own reply is shown
      latestSearch = null;
      document.body.classList.remove("busy");
      $("go").disabled = false;
    }
  }
}

// What the server understood of the query, one chip per part. Removing a chip searches again with
// that part's words as plain meaning: the query without the other parts' words, sent literal,
// and the other parts as explicit filters (the server then understands nothing more).
function showUnderstood(understood) {
  const box = $("understood");
  box.innerHTML = "";
  const parts = understood && !understood.literal ? understood.parts : [];
  box.hidden = parts.length === 0;
  parts.forEach((part, index) => {
    const chip = document.createElement("span");
    chip.className = "chip";
    chip.dataset.kind = part.kind;
    const label = document.createElement("span");
    label.textContent = part.label;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "chip-x";
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Remove ${part.label}: search “${part.text}” as words`);
    remove.addEventListener("click", () => {
      const kept = parts.filter((_, i) => i !== index);
      search({ asked: { query: understood.query, text: withoutParts(understood.query, kept), parts: kept } });
    });
    chip.append(label, remove);
    box.append(chip);
  });
}

// The query without the words of `parts` (those not kept in the meaning: a quoted phrase is).
function withoutParts(query, parts) {
  let text = "", at = 0;
  for (const part of [...parts].sort((a, b) => a.start - b.start)) {
    if (part.in_meaning) continue;
    text += query.slice(at, part.start) + " ";
    at = Math.max(at, part.end);
  }
  return (text + query.slice(at)).split(/\s+/).filter(Boolean).join(" ");
}

// Understood parts as the request's own filters: conditions beside the page's (dates as
// conditions on `taken`, so both ranges hold), kinds where the page names none.
function understoodFilters(body, parts) {
  const where = [...(body.where || [])];
  const types = [];
  for (const part of parts) {
    where.push(...(part.where || []));
    if (part.since) where.push(`taken>=${part.since}`);
    if (part.until) where.push(`taken<=${part.until}`);
    types.push(...(part.types || []));
  }
  return { where: where.length ? where : null, type: body.type || (types.length ? types : null) };
}

function describe(q) {
  if (q && state.image) return `“${q}” + ${state.image.name || "image"}`;
  if (state.image) return state.image.name || "your image";
  return `“${q}”`;
}

function updateUrl(id, q, k, body = {}) {
  const params = new URLSearchParams();
  if (id !== null) params.set("id", id);
  else if (q) params.set("q", q);
  if (id !== null && body.crop) params.set("crop", body.crop.join(","));
  if (k !== String(defaultOf("k"))) params.set("k", k);
  if (body.type) params.set("type", body.type);
  if (body.path) params.set("path", body.path);
  if ($("f-where").value.trim()) params.set("where", $("f-where").value.trim());
  if (body.since) params.set("since", body.since);
  if (body.until) params.set("until", body.until);
  if (body.sort && body.sort !== defaultOf("sort")) params.set("sort", body.sort);
  if (body.min_score) params.set("min", String(body.min_score));
  const url = params.toString() ? "?" + params : location.pathname;
  history.pushState({}, "", url);
}

// The filters a search ran with, as the status line names them ("type pdf, path */2024/*").
function activeFilters(body) {
  const named = [];
  if (body.type) named.push(`type ${body.type}`);
  if (body.path) named.push(`path ${body.path}`);
  if (body.where) named.push(`metadata ${$("f-where").value.trim()}`);
  return named;
}

function render(result, label, named = []) {
  const grid = $("results");
  grid.innerHTML = "";
  $("hint").hidden = true;
  $("status").hidden = false;
  const n = result.hits.length;
  const within = named.length ? ` with ${named.join(", ")}` : "";
  $("status-text").textContent = n
    ? `${n} result${n === 1 ? "" : "s"} for ${label}${within} · ${Math.round(result.took_ms)} ms`
    : `No results for ${label}${within}.` + (named.length ? " Clear the filters to search everything." : "");
  const template = $("card");
  for (const hit of result.hits) {
    const card = template.content.firstElementChild.cloneNode(true);
    card.dataset.id = hit.id;
    const kind = kindOf(hit);
    card.dataset.kind = kind;
    card.querySelector(".kind").textContent = { video: "video", pdf: "pdf", text: "note" }[kind] || "";
    const thumb = card.querySelector(".thumb");
    const img = card.querySelector("img");
    if (hit.thumbnail) {
      loadThumbnail(img, hit.thumbnail);
      thumb.tabIndex = 0;
      thumb.setAttribute("role", "button");
      thumb.setAttribute("aria-label", `Open a larger preview of ${hit.name}`);
      thumb.addEventListener("click", () => openPreview(hit));
      thumb.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); openPreview(hit); } });
      img.alt = hit.page ? `${hit.name}, page ${hit.page}` : hit.name;
      if (hit.page) thumb.classList.add("paged");
      if (kind === "video") thumb.classList.add("video");
    } else {
      thumb.classList.add("textual");
      img.remove();
      thumb.prepend(notePreview(hit));
    }
    card.querySelector(".rank").textContent = "#" + hit.rank;
    const name = card.querySelector(".name");
    name.textContent = hit.name;
    name.title = hit.uri;
    card.querySelector(".page").textContent = hit.page ? `page ${hit.page}` : "";
    const facts = card.querySelector(".facts");
    facts.textContent = factsLine(hit.facts, kind);
    facts.hidden = !facts.textContent;
    // hybrid: the bar and number show the cosine (a fused rank score of ~0.03 says nothing of closeness)
    const shown = hit.similarity ?? hit.score;
    const pct = Math.max(0, Math.min(1, shown)) * 100;
    card.querySelector(".bar > span").style.width = pct.toFixed(1) + "%";
    card.querySelector(".value").textContent = shown.toFixed(3);
    if (hit.similarity != null) card.querySelector(".value").title = `similarity; fused rank score ${hit.score.toFixed(4)}`;
    if (result.rerank) showRerank(card, hit, result);
    card.querySelector(".more").addEventListener("click", () => {
      clearImage();
      $("q").value = "";
      search({ id: hit.id });
      window.scrollTo({ top: 0, behavior: "smooth" });
    });
    grid.append(card);
  }
}

// ---- rerank: both scores, and "why this result" from the reranker's readout attention ---------------
function showRerank(card, hit, result) {
  const row = card.querySelector(".rerank-row");
  row.hidden = false;
  row.querySelector(".rerank-value").textContent = hit.rerank_score === null ? "not reranked" : hit.rerank_score.toFixed(3);
  card.querySelector(".value").title = "embedding cosine";
  if (hit.rerank_score === null) return;
  const why = card.querySelector(".why");
  why.hidden = false;
  why.addEventListener("click", () => explain(card, hit, result.query.text || ""));
}

async function explain(card, hit, query) {
  const button = card.querySelector(".why");
  button.disabled = true;
  try {
    const body = { query, document_id: hit.id };
    if (!query && state.image) body.query = { image: await readAsDataUrl(state.image) };
    const why = await api("/explain", { method: "POST", body: JSON.stringify(body),
                                        headers: { "Content-Type": "application/json" } });
    const panel = card.querySelector(".why-panel");
    panel.hidden = false;
    panel.querySelector(".why-label").textContent =
      `Reranker attention at layer ${why.layer} (where its last token looked), not attribution.`;
    if (why.images.length) drawHeat(card.querySelector(".thumb"), why.images[0]);
    highlightWords(panel.querySelector(".why-text"), why.text);
  } catch (error) {
    failed(error, "Explaining");
  } finally {
    button.disabled = false;
  }
}

// The patch grid over the thumbnail: shown "contain" so the grid covers exactly the picture.
function drawHeat(thumb, map) {
  const img = thumb.querySelector("img");
  if (!img || map.kind !== "image") return;
  thumb.classList.add("explained");
  thumb.querySelectorAll(".heat").forEach((old) => old.remove());
  const rows = map.grid.length, cols = map.grid[0].length;
  const peak = Math.max(...map.grid.flat(), 1e-12);
  const canvas = document.createElement("canvas");
  canvas.className = "heat";
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d");
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      ctx.fillStyle = `rgba(255, ${Math.round(200 * (1 - map.grid[r][c] / peak))}, 0, ${(map.grid[r][c] / peak).toFixed(3)})`;
      ctx.fillRect(c, r, 1, 1);
    }
  }
  const place = () => {
    const box = thumb.getBoundingClientRect();
    const pad = thumb.classList.contains("paged") ? 10 : 0;  // pages sit inside a 10 px padding (style.css)
    const [w, h] = map.size;
    const scale = Math.min((box.width - 2 * pad) / w, (box.height - 2 * pad) / h);
    Object.assign(canvas.style, { width: `${w * scale}px`, height: `${h * scale}px`,
                                  left: `${(box.width - w * scale) / 2}px`, top: `${(box.height - h * scale) / 2}px` });
  };
  place();
  thumb.append(canvas);
}

function highlightWords(target, spans) {
  target.innerHTML = "";
  const peak = Math.max(...spans.map((s) => s.weight), 1e-12);
  for (const span of spans) {
    const mark = document.createElement("mark");
    mark.textContent = span.text;
    mark.style.background = `rgba(255, 170, 0, ${(span.weight / peak).toFixed(3)})`;
    mark.title = `attention ${span.weight.toExponential(2)}`;
    target.append(mark);
  }
}

// What a hit is, for its card: the server's kind of its file (image, pdf, video, text); an item
// added without a file is a picture when it has a thumbnail, else a note.
function kindOf(hit) {
  if (hit.page) return "pdf";
  if (["image", "video", "text"].includes(hit.kind)) return hit.kind;
  return hit.thumbnail ? "image" : "text";
}

function notePreview(hit) {
  const note = document.createElement("div");
  note.className = "note";
  const ext = document.createElement("span");
  ext.className = "ext";
  const suffix = /\.([a-z0-9]{1,5})$/i.exec(hit.name);
  ext.textContent = suffix ? suffix[1].toUpperCase() : "NOTE";
  note.append(ext);
  if (hit.snippet) {  // the note's first lines, sent with the hit
    const text = document.createElement("p");
    text.className = "snippet";
    text.textContent = hit.snippet;
    note.append(text);
    return note;
  }
  for (const width of [92, 78, 86, 60, 70]) {
    const line = document.createElement("span");
    line.className = "line";
    line.style.width = width + "%";
    note.append(line);
  }
  return note;
}

// ---- a larger look at one hit: the server renders /previews/{id}; Esc or a click closes it --------
function openPreview(hit) {
  const box = $("lightbox");
  const img = $("lightbox-img");
  img.removeAttribute("src");
  img.dataset.hit = hit.id;
  img.alt = hit.page ? `${hit.name}, page ${hit.page}` : hit.name;
  loadPreview(img, hit);
  $("lightbox-caption").textContent =
    `${hit.name}${hit.page ? " · page " + hit.page : ""} · score ${hit.score.toFixed(3)}`;
  $("lightbox-caption").title = hit.uri;
  box.hidden = false;
  state.returnFocus = document.activeElement;
  $("lightbox-close").focus();
}

function closePreview() {
  if ($("lightbox").hidden) return;
  $("lightbox").hidden = true;
  if (state.returnFocus) state.returnFocus.focus();
}

async function loadThumbnail(img, url) {
  if (!state.key) { img.src = url; return; }  // no key: the browser fetches (and caches) it itself
  try {  // with a key: fetch with the header, show the bytes
    const response = await fetch(url, { headers: headers() });
    if (response.ok) img.src = URL.createObjectURL(await response.blob());
  } catch (_) { /* the card keeps its placeholder */ }
}

// ---- a region of a hit: a box drawn on its preview (mouse, pen or finger) searches by that region ------
// The preview is the picture scaled down; its answer says the size the server cuts a crop from
// (X-Picture-Size: an image upright, a PDF page as rendered for the model), so the box drawn on the
// displayed preview is scaled to that picture's pixels and sent as `like` + `crop`.
let cropping = null;  // {hit, width, height} of the open preview when a region of it can be searched

async function loadPreview(img, hit) {
  cropping = null;
  img.classList.remove("croppable");
  $("lightbox-hint").hidden = true;
  try {
    const response = await fetch(`/previews/${hit.id}`, { headers: headers() });
    const picture = response.ok ? await response.blob() : null;
    if (!picture || img.dataset.hit !== String(hit.id)) return;  // gone, or another preview opened since
    img.src = URL.createObjectURL(picture);
    const size = (response.headers.get("X-Picture-Size") || "").match(/^(\d+)x(\d+)$/);
    if (!size) return;  // a video: no region to search by
    cropping = { hit, width: Number(size[1]), height: Number(size[2]) };
    img.classList.add("croppable");
    $("lightbox-hint").hidden = false;
  } catch (_) { /* the lightbox keeps its placeholder */ }
}

function wireCrop() {
  const img = $("lightbox-img");
  const box = $("crop-box");
  let start = null;  // the pointer that is drawing, and where it went down
  img.addEventListener("dragstart", (e) => e.preventDefault());
  img.addEventListener("pointerdown", (e) => {
    if (!cropping || e.button > 0) return;
    e.preventDefault();
    try { img.setPointerCapture(e.pointerId); } catch (_) { /* a synthetic pointer: no capture */ }
    start = { id: e.pointerId, x: e.clientX, y: e.clientY };
    showBox(box, regionOf(img, start, e));
  });
  img.addEventListener("pointermove", (e) => {
    if (start && e.pointerId === start.id) showBox(box, regionOf(img, start, e));
  });
  const finish = (e) => {
    if (!start || e.pointerId !== start.id) return;
    const region = regionOf(img, start, e);
    start = null;
    box.hidden = true;
    if (e.type === "pointerup" && region.width >= 4 && region.height >= 4) searchRegion(region);  // less: a click
  };
  img.addEventListener("pointerup", finish);
  img.addEventListener("pointercancel", finish);
}

// The box between where the pointer went down and where it is, kept on the displayed picture.
function regionOf(img, start, e) {
  const r = img.getBoundingClientRect();
  const clampX = (x) => Math.max(r.left, Math.min(r.right, x));
  const clampY = (y) => Math.max(r.top, Math.min(r.bottom, y));
  const [x0, x1] = [clampX(start.x), clampX(e.clientX)].sort((a, b) => a - b);
  const [y0, y1] = [clampY(start.y), clampY(e.clientY)].sort((a, b) => a - b);
  return { left: x0, top: y0, width: x1 - x0, height: y1 - y0, frame: r };
}

function showBox(box, region) {
  Object.assign(box.style, { left: region.left + "px", top: region.top + "px",
                             width: region.width + "px", height: region.height + "px" });
  box.hidden = false;
}

function searchRegion(region) {
  const { hit, width, height } = cropping;
  const sx = width / region.frame.width;
  const sy = height / region.frame.height;
  const x = Math.min(width - 1, Math.floor((region.left - region.frame.left) * sx));
  const y = Math.min(height - 1, Math.floor((region.top - region.frame.top) * sy));
  const crop = [x, y, Math.max(1, Math.min(width - x, Math.round(region.width * sx))),
                Math.max(1, Math.min(height - y, Math.round(region.height * sy)))];
  closePreview();
  clearImage();
  $("q").value = "";
  search({ id: hit.id, crop });
  window.scrollTo({ top: 0, behavior: "smooth" });
}

// ---- image upload and drag-and-drop -------------------------------------------------------------
function setImage(file) {
  if (!file || !file.type.startsWith("image/")) {
    showBanner("That is not an image file; drop a PNG, JPEG, WebP or GIF.");
    return;
  }
  state.image = file;
  $("image-preview").src = URL.createObjectURL(file);
  $("image-name").textContent = file.name || "image";
  $("image-chip").hidden = false;
  search();
}

function clearImage() {
  state.image = null;
  $("image").value = "";
  $("image-chip").hidden = true;
}

function downloadResults() {
  if (!state.results) return;
  const blob = new Blob([JSON.stringify(state.results, null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = "faste-mm-results.json";
  document.body.append(a);
  a.click();
  a.remove();
}

function fromUrl() {
  const params = new URLSearchParams(location.search);
  selectK(params.get("k"));
  const type = params.get("type");
  $("f-type").value = type && [...$("f-type").options].some((o) => o.value === type) ? type : "";
  $("f-path").value = params.get("path") || "";
  $("f-where").value = params.get("where") || "";
  $("f-since").value = params.get("since") || "";
  $("f-until").value = params.get("until") || "";
  const sort = params.get("sort");
  $("f-sort").value = sort && [...$("f-sort").options].some((o) => o.value === sort) ? sort : defaultOf("sort");
  $("f-min").value = params.get("min") || "0";
  minScore();
  if (params.has("id")) {
    $("q").value = "";
    const crop = (params.get("crop") || "").split(",").map(Number);
    search({ id: Number(params.get("id")), pushUrl: false,
             crop: crop.length === 4 && crop.every(Number.isInteger) ? crop : null });
  } else if (params.get("q")) {
    $("q").value = params.get("q");
    search({ pushUrl: false });
  }
}

function wire() {
  $("search-form").addEventListener("submit", (event) => { event.preventDefault(); search(); });
  $("literal").addEventListener("change", () => { if (state.results) search(); });
  $("image").addEventListener("change", () => setImage($("image").files[0]));
  $("image-clear").addEventListener("click", () => { clearImage(); $("q").focus(); });
  $("download").addEventListener("click", downloadResults);
  // A changed filter re-runs the search on screen (Enter in a field, or a new type).
  $("filters").addEventListener("submit", (event) => event.preventDefault());
  for (const field of [$("f-path"), $("f-where")]) {
    field.addEventListener("keydown", (event) => {
      if (event.key === "Enter") { event.preventDefault(); if (state.results || $("q").value.trim()) search(); }
    });
  }
  for (const field of [$("f-type"), $("f-since"), $("f-until"), $("f-sort"), $("f-min")]) {
    field.addEventListener("change", () => { if (state.results) search(); else filters(); });
  }
  $("f-min").addEventListener("input", minScore);
  $("mode").addEventListener("change", minScore);
  $("f-clear").addEventListener("click", () => {
    $("f-type").value = ""; $("f-path").value = ""; $("f-where").value = "";
    $("f-since").value = ""; $("f-until").value = ""; $("f-sort").value = defaultOf("sort"); $("f-min").value = "0";
    if (state.results) search(); else filters();
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("key").value.trim();
    sessionStorage.setItem("faste-mm-key", state.key);
    hideBanner();
    loadInfo().then((info) => { if (info) fromUrl(); });
  });
  let depth = 0;
  const zone = $("dropzone");
  window.addEventListener("dragenter", (e) => { if (hasFile(e)) { depth++; zone.hidden = false; } });
  window.addEventListener("dragleave", () => { depth = Math.max(0, depth - 1); if (!depth) zone.hidden = true; });
  window.addEventListener("dragover", (e) => { if (hasFile(e)) e.preventDefault(); });
  window.addEventListener("drop", (e) => {
    e.preventDefault();
    depth = 0;
    zone.hidden = true;
    if (e.dataTransfer.files.length) setImage(e.dataTransfer.files[0]);
  });
  window.addEventListener("popstate", fromUrl);
  $("lightbox-close").addEventListener("click", closePreview);
  $("lightbox").addEventListener("click", (e) => { if (e.target === $("lightbox")) closePreview(); });
  window.addEventListener("keydown", (e) => { if (e.key === "Escape") closePreview(); });
  wireCrop();
}

function hasFile(event) {
  return event.dataTransfer && [...event.dataTransfer.types].includes("Files");
}

wire();
loadOptions().then((ready) => ready && loadInfo()).then((info) => { if (info) fromUrl(); });
