// The page's one script: POST /predict with the SMILES, a table of the rows, CSV download,
// and POST /explain for the picture of a clicked row. No build step, no dependencies.
"use strict";

let rows = [];
const apiKey = new URLSearchParams(location.search).get("key");
const headers = { "Content-Type": "application/json" };
if (apiKey) headers["X-API-Key"] = apiKey;

function status(text, isError) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.className = isError ? "error" : "";
}

async function describeModel() {
  const response = await fetch("/model", { headers });
  if (!response.ok) return;
  const info = await response.json();
  document.getElementById("model").textContent =
    `${info.task_type}: ${info.tasks.join(", ")} (${info.units})`;
}

function smilesFromCsv(text) {
  const lines = text.split(/\r?\n/).filter((line) => line.trim() !== "");
  if (!lines.length) return [];
  // A naive CSV reader: SMILES hold no commas, and the column is named `smiles`.
  const header = lines[0].split(",").map((name) => name.trim().toLowerCase());
  const column = header.indexOf("smiles");
  if (column < 0) return lines.map((line) => line.split(",")[0].trim());
  return lines.slice(1).map((line) => (line.split(",")[column] || "").trim());
}

async function predict() {
  let smiles = document.getElementById("smiles").value.split(/\r?\n/)
    .map((s) => s.trim()).filter((s) => s !== "");
  const file = document.getElementById("file").files[0];
  if (file) smiles = smiles.concat(smilesFromCsv(await file.text()));
  if (!smiles.length) { status("paste SMILES or choose a CSV file", true); return; }
  status("predicting...");
  const response = await fetch("/predict", {
    method: "POST", headers, body: JSON.stringify({ smiles }),
  });
  const answer = await response.json();
  if (!response.ok) { status(answer.detail || response.statusText, true); return; }
  rows = answer.rows;
  show(rows);
  const failed = rows.filter((row) => row.error).length;
  status(`${rows.length} rows, ${failed} without a prediction`);
  document.getElementById("download").disabled = false;
}

function show(found) {
  const table = document.getElementById("results");
  table.innerHTML = "";
  if (!found.length) return;
  const columns = Object.keys(found[0]);
  const head = table.insertRow();
  for (const name of columns) {
    const th = document.createElement("th");
    th.textContent = name;
    head.appendChild(th);
  }
  found.forEach((row) => {
    const tr = table.insertRow();
    tr.className = "row";
    for (const name of columns) {
      const td = tr.insertCell();
      const value = row[name];
      td.textContent = value === null ? "" : (typeof value === "number" ? value.toPrecision(4) : value);
      if (name === "error" && value) td.className = "error";
    }
    tr.addEventListener("click", () => picture(row.smiles));
  });
}

async function picture(smiles) {
  const holder = document.getElementById("picture");
  holder.innerHTML = "";
  const response = await fetch("/explain", {
    method: "POST", headers, body: JSON.stringify({ smiles }),
  });
  if (!response.ok) {
    const answer = await response.json();
    holder.textContent = answer.detail || response.statusText;
    holder.className = "error";
    return;
  }
  holder.className = "";
  const img = document.createElement("img");
  img.alt = smiles;
  img.src = URL.createObjectURL(await response.blob());
  holder.appendChild(img);
}

function csvCell(value) {
  if (value === null || value === undefined) return "";
  const text = String(value);
  return /[",\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

function download() {
  if (!rows.length) return;
  const columns = Object.keys(rows[0]);
  const lines = [columns.join(",")].concat(
    rows.map((row) => columns.map((name) => csvCell(row[name])).join(",")));
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }));
  link.download = "predictions.csv";
  link.click();
}

document.getElementById("predict").addEventListener("click", predict);
document.getElementById("download").addEventListener("click", download);
describeModel();
