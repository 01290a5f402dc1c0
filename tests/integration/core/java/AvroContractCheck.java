import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import java.io.IOException;
import java.lang.reflect.Method;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.apache.avro.Schema;
import org.apache.avro.SchemaCompatibility;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.compiler.specific.SpecificCompiler;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

/**
 * mailtap's Avro contract as Apache Avro (Java) sees it; driven by
 * tests/integration/core/test_java_avro.py, which writes the manifest and reads the result.
 *
 * <p>Manifest (JSON): {@code parse_order} (the current schema files, shared types first, parsed
 * by ONE parser as a code generator does), {@code topics}, {@code history} (released versions),
 * {@code invalid} (files that must fail with default validation on), {@code compat} (reader /
 * writer pairs for SchemaCompatibility), {@code records} (bytes written by Python, single-object
 * or Confluent-framed with the registry's writer schema) and {@code out} (a work folder).
 */
public final class AvroContractCheck {
  private static final ObjectMapper JSON = new ObjectMapper();

  public static void main(String[] args) throws Exception {
    JsonNode manifest = JSON.readTree(new File(args[0]));
    Path out = Path.of(manifest.get("out").asText());
    ObjectNode result = JSON.createObjectNode();
    result.put("avro_version", Schema.class.getPackage().getImplementationVersion());

    // 1. Every current file through one parser, in the documented order, defaults validated.
    Schema.Parser parser = new Schema.Parser();
    Map<String, Schema> topics = new HashMap<>();
    for (JsonNode file : manifest.get("parse_order")) {
      Schema schema = parser.parse(new File(file.asText()));
      topics.put(schema.getName(), schema);
    }
    ObjectNode fingerprints = result.putObject("fingerprints");
    for (JsonNode name : manifest.get("topics")) {
      Schema schema = topics.get(name.asText());
      // Round trip through the schema's own JSON: what a registry stores and hands out.
      Schema again = new Schema.Parser().parse(schema.toString());
      if (!again.equals(schema)) {
        throw new IllegalStateException(name + ": schema changed in a JSON round trip");
      }
      fingerprints.put(name.asText(), SchemaNormalization.parsingFingerprint64(schema));
    }

    // 2. Files that a validating parser must refuse (the v1 ReplyCommand default).
    ObjectNode invalid = result.putObject("invalid");
    for (JsonNode file : manifest.get("invalid")) {
      try {
        new Schema.Parser().parse(new File(file.asText()));
        invalid.put(file.asText(), "ACCEPTED");
      } catch (RuntimeException e) {
        invalid.put(file.asText(), "REFUSED: " + e.getMessage());
      }
    }

    // 3. Schema resolution both ways: SchemaCompatibility, as the registries use it.
    ObjectNode compat = result.putObject("compat");
    for (JsonNode pair : manifest.get("compat")) {
      Schema reader = lenient(pair.get("reader").asText());
      Schema writer = lenient(pair.get("writer").asText());
      SchemaCompatibility.SchemaPairCompatibility check =
          SchemaCompatibility.checkReaderWriterCompatibility(reader, writer);
      boolean ok = check.getType() == SchemaCompatibility.SchemaCompatibilityType.COMPATIBLE;
      compat.put(
          pair.get("label").asText(),
          ok ? "COMPATIBLE" : check.getType() + ": " + check.getResult().getIncompatibilities());
    }

    // 4. Code generation of every topic schema, compiled.
    Path sources = out.resolve("generated-sources");
    Path classes = out.resolve("generated-classes");
    Files.createDirectories(classes);
    for (JsonNode name : manifest.get("topics")) {
      new SpecificCompiler(topics.get(name.asText())).compileToDestination(null, sources.toFile());
    }
    List<String> javaFiles = new ArrayList<>();
    try (Stream<Path> walk = Files.walk(sources)) {
      walk.filter(p -> p.toString().endsWith(".java")).forEach(p -> javaFiles.add(p.toString()));
    }
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    List<String> javacArgs =
        new ArrayList<>(
            Arrays.asList(
                "-nowarn", "-classpath", System.getProperty("java.class.path"), "-d",
                classes.toString()));
    javacArgs.addAll(javaFiles);
    int rc = javac.run(null, null, null, javacArgs.toArray(new String[0]));
    result.put("codegen_files", javaFiles.size());
    result.put("codegen_javac_exit", rc);
    // Avro itself is loaded again next to the generated classes: a generated class's
    // SpecificData looks classes up in the loader that loaded Avro.
    List<URL> urls = new ArrayList<>();
    urls.add(classes.toUri().toURL());
    for (String entry : System.getProperty("java.class.path").split(File.pathSeparator)) {
      urls.add(Path.of(entry).toUri().toURL());
    }
    URLClassLoader generated =
        new URLClassLoader(urls.toArray(new URL[0]), ClassLoader.getPlatformClassLoader());

    // 5. Real records: decode, re-encode (same bytes), and through the generated classes.
    ObjectNode records = result.putObject("records");
    for (JsonNode item : manifest.get("records")) {
      String name = item.get("schema").asText();
      Schema current = topics.get(name);
      byte[] data = Files.readAllBytes(Path.of(item.get("data").asText()));
      ObjectNode entry = records.putObject(item.get("label").asText());
      GenericRecord record;
      byte[] body;
      if (item.get("encoding").asText().equals("single-object")) {
        BinaryMessageDecoder<GenericRecord> decoder =
            new BinaryMessageDecoder<>(GenericData.get(), current);
        for (JsonNode file : manifest.get("history")) {
          decoder.addSchema(lenient(file.asText()));
        }
        record = decoder.decode(data);
        ByteBuffer again = new BinaryMessageEncoder<GenericRecord>(GenericData.get(), current)
            .encode(record);
        entry.put("reencoded_equal", Arrays.equals(toArray(again), data));
        body = Arrays.copyOfRange(data, 10, data.length);
        entry.put("generated_equal", viaGeneratedClass(generated, current, data));
      } else {
        // Confluent framing: 0x00, 4-byte schema id, Avro binary of the registry's schema.
        Schema writer = new Schema.Parser().parse(new File(item.get("writer").asText()));
        body = Arrays.copyOfRange(data, 5, data.length);
        record =
            new GenericDatumReader<GenericRecord>(writer, current)
                .read(null, DecoderFactory.get().binaryDecoder(body, null));
        entry.put("writer_fingerprint_equal",
            SchemaNormalization.parsingFingerprint64(writer)
                == SchemaNormalization.parsingFingerprint64(current));
      }
      java.io.ByteArrayOutputStream plain = new java.io.ByteArrayOutputStream();
      BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(plain, null);
      new GenericDatumWriter<GenericRecord>(current).write(record, encoder);
      encoder.flush();
      entry.put("body_reencoded_equal", Arrays.equals(plain.toByteArray(), body));
      entry.set("value", JSON.readTree(GenericData.get().toString(record)));
    }
    JSON.writerWithDefaultPrettyPrinter().writeValue(out.resolve("result.json").toFile(), result);
  }

  /** History files are parsed as released: v1's ReplyCommand has a default Java refuses. */
  @SuppressWarnings("deprecation")
  private static Schema lenient(String file) throws IOException {
    Schema.Parser parser = new Schema.Parser();
    parser.setValidateDefaults(false);
    return parser.parse(new File(file));
  }

  /** Single-object bytes through the generated class's fromByteBuffer/toByteBuffer. */
  private static boolean viaGeneratedClass(ClassLoader loader, Schema schema, byte[] data)
      throws Exception {
    Class<?> type = loader.loadClass(schema.getFullName());
    Method from = type.getMethod("fromByteBuffer", ByteBuffer.class);
    Object value = from.invoke(null, ByteBuffer.wrap(data));
    ByteBuffer again = (ByteBuffer) type.getMethod("toByteBuffer").invoke(value);
    return Arrays.equals(toArray(again), data);
  }

  private static byte[] toArray(ByteBuffer buffer) {
    byte[] bytes = new byte[buffer.remaining()];
    buffer.duplicate().get(bytes);
    return bytes;
  }
}
