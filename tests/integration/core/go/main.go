// Command avrocheck holds mailtap's Avro contract to Go's hamba/avro, driven by
// tests/integration/core/test_go_avro.py with the same manifest as AvroContractCheck.java:
// parse_order (shared types first, one schema cache), topics, invalid (files the parser must
// refuse), compat (reader/writer pairs), records (single-object bytes written by Python).
// It writes result.json into the manifest's out folder.
package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hamba/avro/v2"
)

type pair struct {
	Label  string `json:"label"`
	Reader string `json:"reader"`
	Writer string `json:"writer"`
}

type record struct {
	Label    string `json:"label"`
	Schema   string `json:"schema"`
	Encoding string `json:"encoding"`
	Data     string `json:"data"`
}

type manifest struct {
	ParseOrder []string `json:"parse_order"`
	Topics     []string `json:"topics"`
	Invalid    []string `json:"invalid"`
	Compat     []pair   `json:"compat"`
	Records    []record `json:"records"`
	Out        string   `json:"out"`
}

type decoded struct {
	ReencodedEqual bool           `json:"reencoded_equal"`
	Reencoded      string         `json:"reencoded"`
	Value          map[string]any `json:"value"`
}

type result struct {
	Fingerprints map[string]string  `json:"fingerprints"`
	Invalid      map[string]string  `json:"invalid"`
	Compat       map[string]string  `json:"compat"`
	Records      map[string]decoded `json:"records"`
}

func parseFile(path string, cache *avro.SchemaCache) (avro.Schema, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return avro.ParseWithCache(string(text), "", cache)
}

func run(manifestPath string) error {
	text, err := os.ReadFile(manifestPath)
	if err != nil {
		return err
	}
	var m manifest
	if err := json.Unmarshal(text, &m); err != nil {
		return err
	}
	res := result{map[string]string{}, map[string]string{}, map[string]string{}, map[string]decoded{}}

	// One cache for every current file, shared types first: what a code generator does.
	cache := &avro.SchemaCache{}
	topics := map[string]avro.Schema{}
	for _, file := range m.ParseOrder {
		schema, err := parseFile(file, cache)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if named, ok := schema.(avro.NamedSchema); ok {
			topics[named.Name()] = schema
		}
	}
	for _, name := range m.Topics {
		fp, err := topics[name].FingerprintUsing(avro.CRC64AvroLE)
		if err != nil {
			return err
		}
		res.Fingerprints[name] = hex.EncodeToString(fp)
	}
	for _, file := range m.Invalid {
		if _, err := parseFile(file, &avro.SchemaCache{}); err != nil {
			res.Invalid[file] = "REFUSED: " + err.Error()
		} else {
			res.Invalid[file] = "ACCEPTED"
		}
	}
	compat := avro.NewSchemaCompatibility()
	for _, p := range m.Compat {
		reader, err := parseFile(p.Reader, &avro.SchemaCache{})
		if err != nil {
			res.Compat[p.Label] = "UNPARSEABLE reader: " + err.Error()
			continue
		}
		writer, err := parseFile(p.Writer, &avro.SchemaCache{})
		if err != nil {
			res.Compat[p.Label] = "UNPARSEABLE writer: " + err.Error()
			continue
		}
		if err := compat.Compatible(reader, writer); err != nil {
			res.Compat[p.Label] = "INCOMPATIBLE: " + err.Error()
		} else {
			res.Compat[p.Label] = "COMPATIBLE"
		}
	}
	for _, r := range m.Records {
		data, err := os.ReadFile(r.Data)
		if err != nil {
			return err
		}
		schema := topics[r.Schema]
		// Single-object encoding: C3 01, 8-byte CRC-64-AVRO fingerprint, Avro binary.
		body := data[10:]
		var value map[string]any
		if err := avro.Unmarshal(schema, body, &value); err != nil {
			return fmt.Errorf("%s: decode: %w", r.Label, err)
		}
		again, err := avro.Marshal(schema, value)
		if err != nil {
			return fmt.Errorf("%s: encode: %w", r.Label, err)
		}
		// Equal bytes are not guaranteed: hamba writes array blocks with their byte size (a
		// negative count), which the specification allows; Python decodes the file to compare.
		reencoded := filepath.Join(m.Out, r.Label+".go.bin")
		if err := os.WriteFile(reencoded, again, 0o644); err != nil {
			return err
		}
		res.Records[r.Label] = decoded{bytes.Equal(again, body), reencoded, value}
	}
	out, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(m.Out, "result.json"), out, 0o644)
}

func main() {
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
